"""The worker runtime: WorkerManager and the parts it wires together.

Each policy lives in its own module and can be tested alone: settling (:mod:`.settle`),
lock renewal (:mod:`.renewal`), promotion and stalled reclaim (:mod:`.maintenance`),
running processors (:mod:`.execute`), per-job stages (:mod:`.process`), fetching and
dispatch (:mod:`.worker`), and orchestration (:mod:`.manager`).
"""

from streamq.runtime.manager import WorkerManager
from streamq.runtime.worker import Worker

__all__ = ["Worker", "WorkerManager"]
