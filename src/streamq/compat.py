"""Contract snapshots and the compatibility check between two of them.

A snapshot is the JSON form of a set of contracts: per queue its shards, secondary lane,
defaults and tenant field, and per job the payload's JSON schema. Commit one next to the code
and let CI compare it with the contracts being deployed: :func:`check_compatible` names every
change that would break a job already in Redis or a peer still running the old code.

Compatibility here is *backward* (the Avro/Protobuf sense): a consumer built from the new
contract must accept every payload the old contract allowed, and an old consumer must still
find every field it reads. Widening a type (``int`` -> ``int | None``) passes; deploy the
workers before producers start sending the new values.

Example::

    $ python -m streamq.compat snapshot myapp.contracts:CONTRACTS > contracts.json
    $ python -m streamq.compat check contracts.json new.json   # exit 1 on breaking changes
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from streamq._schema_compat import Json, canonical_json, schema_diffs
from streamq.contracts import ContractSet, JobSpec, QueueContract
from streamq.errors import ContractError, IncompatibleContract, StreamqError
from streamq.loader import load_object

__all__ = ["FORMAT", "Change", "assert_compatible", "check_compatible", "main", "snapshot"]

# `streamq/__init__` imports this module, so `python -m streamq.compat` finds it imported
# before running it as __main__, and runpy warns about that unless the module looks like a
# package. An empty __path__ says so (there are no submodules) and keeps the CLI quiet.
__path__: list[str] = []

FORMAT = 1
"""The snapshot format version; :func:`check_compatible` refuses other versions."""



@dataclass(frozen=True, slots=True)
class Change:
    """One difference between two snapshots.

    Attributes:
        queue: the queue (lane) it concerns.
        job: the job name, or None for a queue-level change.
        field: the dotted payload field path (``address.zip``, ``tags[]``), or None.
        kind: a stable identifier such as ``field_removed`` or ``shards_changed``.
        message: one line for a human.
        breaking: True when the change would break in-flight jobs or a running peer.
    """

    queue: str
    job: str | None
    field: str | None
    kind: str
    message: str
    breaking: bool

    def __str__(self) -> str:
        where = "/".join(p for p in (self.queue, self.job) if p)
        if self.field:
            where += f" field {self.field!r}"
        return f"{'BREAKING' if self.breaking else 'ok'} {self.kind}: {where}: {self.message}"


# -- snapshot --------------------------------------------------------------------------------


def _contracts(
    contracts: ContractSet | type[QueueContract] | Iterable[type[QueueContract]],
) -> ContractSet:
    if isinstance(contracts, ContractSet):
        return contracts
    if isinstance(contracts, type):
        return ContractSet(contracts)
    return ContractSet(*contracts)


def _canonical(obj: Any) -> Any:
    """``obj`` with every mapping's keys sorted (lists keep their order)."""
    if isinstance(obj, dict):
        return {k: _canonical(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list | tuple):
        return [_canonical(v) for v in obj]
    return obj


def _job_snapshot(spec: JobSpec[Any]) -> Json:
    snap: Json = {
        "name": spec.name,
        "model": f"{spec.model.__module__}.{spec.model.__qualname__}",
        "schema": spec.model.model_json_schema(mode="validation"),
    }
    # Only when declared, so that contracts without tracking keep their fingerprints.
    if spec.result_model is not None:
        rm = spec.result_model
        snap["result"] = {
            "model": f"{rm.__module__}.{rm.__qualname__}",
            "schema": rm.model_json_schema(mode="validation"),
        }
    if spec.track:
        snap["tracking"] = {"keep_result_ms": spec.keep_result_ms}
    return snap


def _result_changes(queue: str, job: str, old: Json, new: Json) -> Iterator[Change]:
    """Changes of a job's result model: results written by one version are read by the other
    (``Queue.result`` validates them against the reader's model) while a deploy rolls."""
    o_res, n_res = old.get("result"), new.get("result")
    if o_res and not n_res:
        yield Change(queue, job, None, "result_removed", "result model removed: producers "
                     "that read results get plain JSON or none", True)
    elif n_res and not o_res:
        yield Change(queue, job, None, "result_added", "result model added", False)
    elif o_res and n_res:
        for d in schema_diffs(o_res["schema"], n_res["schema"]):
            yield Change(queue, job, d.field or None, f"result_{d.kind}",
                         f"result: {d.message}", d.breaking)
    if old.get("tracking") != new.get("tracking"):
        yield Change(queue, job, None, "tracking_changed",
                     f"tracking changed from {canonical_json(old.get('tracking'))} to "
                     f"{canonical_json(new.get('tracking'))}", False)


def _queue_snapshot(c: type[QueueContract]) -> Json:
    d = c.defaults
    return {
        "name": c.queue_name,
        "shards": c.shards,
        "secondary": (
            None
            if c.secondary is None
            else {"name": c.secondary.name, "shards": c.secondary.shards}
        ),
        "defaults": {
            "attempts": d.attempts,
            "backoff": d.backoff.describe(),
            "dedup_window_ms": d.dedup_window_ms,
            "max_payload_bytes": d.max_payload_bytes,
        },
        "tenant_field": c.tenant_field,
        "secret_fields": sorted(c.secret_fields),
        "jobs": {name: _job_snapshot(spec) for name, spec in c.jobs.items()},
    }


def fingerprint(snap: Json) -> str:
    """The sha256 of a snapshot's canonical JSON, its ``fingerprint`` field left out."""
    body = {k: v for k, v in snap.items() if k != "fingerprint"}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def snapshot(
    contracts: ContractSet | type[QueueContract] | Iterable[type[QueueContract]],
) -> Json:
    """A JSON-serialisable description of ``contracts`` with sorted keys, a ``format``
    version and a ``fingerprint`` (sha256 of the canonical JSON).

    Example::

        Path("contracts.json").write_text(json.dumps(snapshot(CONTRACTS), indent=2))
    """
    cs = _contracts(contracts)
    snap: Json = _canonical(
        {"format": FORMAT, "queues": {c.queue_name: _queue_snapshot(c) for c in cs}}
    )
    snap["fingerprint"] = fingerprint(snap)
    out: Json = _canonical(snap)
    return out


# -- snapshot comparison ---------------------------------------------------------------------


def _lane_changes(name: str, old: Json, new: Json) -> Iterator[Change]:
    if old["shards"] != new["shards"]:
        yield Change(
            name,
            None,
            None,
            "shards_changed",
            f"shard count changed from {old['shards']} to {new['shards']}: keys map to other "
            "shards, so dedup and per-key ordering break and jobs on removed shards are "
            "stranded",
            True,
        )
    o2, n2 = old.get("secondary"), new.get("secondary")
    if o2 and not n2:
        yield Change(
            name,
            None,
            None,
            "secondary_removed",
            f"secondary lane {o2['name']!r} removed: its queued jobs are stranded and producers "
            "routing to it fail",
            True,
        )
    elif n2 and not o2:
        yield Change(
            name, None, None, "secondary_added", f"secondary lane {n2['name']!r} added", False
        )
    elif o2 and n2 and o2["shards"] != n2["shards"]:
        yield Change(
            name,
            None,
            None,
            "secondary_shards_changed",
            f"secondary lane {o2['name']!r} shard count changed from {o2['shards']} to "
            f"{n2['shards']}: keys map to other shards",
            True,
        )


def _queue_changes(name: str, old: Json, new: Json) -> Iterator[Change]:
    yield from _lane_changes(name, old, new)
    if old.get("tenant_field") != new.get("tenant_field"):
        yield Change(
            name,
            None,
            None,
            "tenant_field_changed",
            f"tenant field changed from {old.get('tenant_field')!r} to "
            f"{new.get('tenant_field')!r}: running peers attribute jobs to tenants differently",
            True,
        )
    if old.get("defaults") != new.get("defaults"):
        yield Change(
            name,
            None,
            None,
            "defaults_changed",
            f"job defaults changed from {canonical_json(old.get('defaults'))} to "
            f"{canonical_json(new.get('defaults'))}",
            False,
        )
    if old.get("secret_fields") != new.get("secret_fields"):
        yield Change(name, None, None, "secret_fields_changed", "secret fields changed", False)
    o_jobs: Json = old["jobs"]
    n_jobs: Json = new["jobs"]
    for job_name, o_job in o_jobs.items():
        if job_name not in n_jobs:
            yield Change(
                name,
                job_name,
                None,
                "job_removed",
                "job removed: in-flight jobs of this name become unknown to workers and are "
                "dead-lettered",
                True,
            )
            continue
        for d in schema_diffs(o_job["schema"], n_jobs[job_name]["schema"]):
            yield Change(name, job_name, d.field or None, d.kind, d.message, d.breaking)
        yield from _result_changes(name, job_name, o_job, n_jobs[job_name])
    for job_name in n_jobs:
        if job_name not in o_jobs:
            yield Change(name, job_name, None, "job_added", "new job", False)


def _check_format(snap: Json, which: str) -> None:
    if not isinstance(snap, dict) or snap.get("format") != FORMAT or "queues" not in snap:
        got = snap.get("format") if isinstance(snap, dict) else type(snap).__name__
        raise ContractError(f"{which} snapshot is not a streamq format {FORMAT} snapshot: {got!r}")


def check_compatible(old: Json, new: Json) -> list[Change]:
    """Every difference from snapshot ``old`` to ``new``, breaking ones flagged.

    Breaking: a removed queue, secondary lane, job or field; a new required field or an
    optional one becoming required; a changed or narrowed field type (nested models
    included); a changed shard count (primary or secondary); a changed tenant field.
    Additive (``breaking=False``): new queues, jobs and optional fields, widened types,
    changed defaults. Descriptions and titles are ignored.

    Example::

        breaking = [c for c in check_compatible(old, snapshot(CONTRACTS)) if c.breaking]
    """
    _check_format(old, "old")
    _check_format(new, "new")
    changes: list[Change] = []
    o_queues: Json = old["queues"]
    n_queues: Json = new["queues"]
    for name, oq in o_queues.items():
        if name not in n_queues:
            changes.append(
                Change(
                    name,
                    None,
                    None,
                    "queue_removed",
                    "queue removed: its queued jobs are stranded and producers still running "
                    "the old contract keep writing to it",
                    True,
                )
            )
        else:
            changes.extend(_queue_changes(name, oq, n_queues[name]))
    for name in n_queues:
        if name not in o_queues:
            changes.append(Change(name, None, None, "queue_added", "new queue", False))
    return changes


def assert_compatible(old: Json, new: Json) -> list[Change]:
    """Raise :class:`~streamq.errors.IncompatibleContract` listing the breaking changes from
    ``old`` to ``new``; return the (additive) changes otherwise."""
    changes = check_compatible(old, new)
    breaking = [str(c) for c in changes if c.breaking]
    if breaking:
        raise IncompatibleContract(
            f"{len(breaking)} breaking contract change(s):\n  " + "\n  ".join(breaking),
            changes=breaking,
        )
    return changes


# -- command line ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``snapshot module:CONTRACTS`` prints a snapshot; ``check old.json new.json`` prints
    each change and returns 1 when any is breaking."""
    parser = argparse.ArgumentParser(prog="streamq compat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_snap = sub.add_parser("snapshot", help="print the JSON snapshot of module:CONTRACTS")
    p_snap.add_argument("target", help="module:ATTRIBUTE (a ContractSet or QueueContract)")
    p_check = sub.add_parser("check", help="compare two snapshots; exit 1 on breaking changes")
    p_check.add_argument("old")
    p_check.add_argument("new")
    args = parser.parse_args(argv)
    try:
        if args.command == "snapshot":
            target = load_object(args.target)
            print(json.dumps(snapshot(target), indent=2, sort_keys=True))
            return 0
        with open(args.old, encoding="utf-8") as f_old, open(args.new, encoding="utf-8") as f_new:
            changes = check_compatible(json.load(f_old), json.load(f_new))
    except (OSError, ValueError, ImportError, AttributeError, StreamqError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for c in changes:
        print(c)
    n = sum(c.breaking for c in changes)
    print(f"{n} breaking change(s), {len(changes) - n} compatible change(s)", file=sys.stderr)
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())
