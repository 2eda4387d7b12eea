"""The worker runtime: WorkerManager and the parts it wires together.

Each policy lives in its own module, shares a :class:`~.context.LaneContext` and can be
tested alone: fetching within the bound (:mod:`.fetch`), starting jobs (:mod:`.dispatch`),
batches (:mod:`.batch`), per-job stages and confirmed
outcomes (:mod:`.process`), running processors (:mod:`.execute`), settling
(:mod:`.settle`), lock renewal (:mod:`.renewal`), stalled reclaim (:mod:`.reclaim`),
promotion (:mod:`.promote`), heartbeat and leaving (:mod:`.heartbeat`), supervision of
every loop (:mod:`.supervise`); :mod:`.worker` wires one lane and :mod:`.manager` the lanes.
"""

from streamq.runtime.manager import WorkerManager
from streamq.runtime.worker import Worker

__all__ = ["Worker", "WorkerManager"]
