"""Contract snapshots and the compatibility check between two of them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from datetime import date, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field, create_model

import streamq
from streamq import (
    Change,
    ContractError,
    ContractSet,
    IncompatibleContract,
    JobDefaults,
    QueueContract,
    assert_compatible,
    check_compatible,
    job,
    snapshot,
)


class Address(BaseModel):
    street: str
    zip: str


class AddressIntZip(BaseModel):
    street: str
    zip: int


class Color(StrEnum):
    red = "red"
    blue = "blue"


class OnlyRed(StrEnum):
    red = "red"


class Tree(BaseModel):
    value: int
    children: list[Tree] = []


class Event(BaseModel):
    project_id: str
    count: int
    note: str | None = None
    address: Address | None = None
    color: Color = Color.red
    kind: Literal["a", "b"] = "a"
    tags: list[str] = []
    at: datetime | None = None
    size: int = Field(default=0, ge=0)
    tree: Tree | None = None


class OtherJob(BaseModel):
    project_id: str


def evolved(**fields: Any) -> type[BaseModel]:
    """``Event`` with fields replaced (``(type, default)``), added, or removed (None)."""
    spec: dict[str, Any] = {k: (f.annotation, f) for k, f in Event.model_fields.items()}
    for name, value in fields.items():
        if value is None:
            spec.pop(name)
        else:
            spec[name] = value
    return create_model("Event", **spec)


def contract(
    model: type[BaseModel] = Event,
    *,
    name: str = "ingestion",
    extra_job: bool = False,
    **kw: Any,
) -> type[QueueContract]:
    attrs: dict[str, Any] = {"ingest": job("ingest-event", model)}
    if extra_job:
        attrs["other"] = job("other-job", OtherJob)
    kw.setdefault("tenant_field", "project_id")
    return type(f"C{name}", (QueueContract,), attrs, name=name, **kw)


def changes(old: Any, new: Any) -> list[Change]:
    return check_compatible(snapshot(old), snapshot(new))


def kinds(found: list[Change]) -> set[tuple[str | None, str, bool]]:
    return {(c.field, c.kind, c.breaking) for c in found}


def breaking(found: list[Change]) -> list[Change]:
    return [c for c in found if c.breaking]


# -- snapshot ------------------------------------------------------------------------------------


def test_snapshot_describes_queues_lanes_defaults_and_payload_schemas() -> None:
    c = contract(shards=4, secondary_shards=2, defaults=JobDefaults(attempts=5))
    snap = snapshot(c)
    assert snap["format"] == 1
    q = snap["queues"]["ingestion"]
    assert q["name"] == "ingestion"
    assert q["shards"] == 4
    assert q["secondary"] == {"name": "ingestion-secondary", "shards": 2}
    assert q["tenant_field"] == "project_id"
    assert q["defaults"]["attempts"] == 5
    assert q["defaults"]["max_payload_bytes"] == 1024 * 1024
    job_snap = q["jobs"]["ingest-event"]
    assert job_snap["name"] == "ingest-event"
    assert job_snap["schema"]["required"] == ["project_id", "count"]
    assert job_snap["schema"]["properties"]["count"]["type"] == "integer"
    assert "Address" in job_snap["schema"]["$defs"]


def test_snapshot_is_json_with_sorted_keys_and_a_sha256_fingerprint() -> None:
    snap = snapshot(contract())
    text = json.dumps(snap)
    assert json.loads(text) == snap
    assert list(snap) == sorted(snap)
    assert list(snap["queues"]["ingestion"]) == sorted(snap["queues"]["ingestion"])
    body = {k: v for k, v in snap.items() if k != "fingerprint"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert snap["fingerprint"] == hashlib.sha256(canonical.encode()).hexdigest()


def test_snapshot_is_stable_across_calls_and_input_forms() -> None:
    c = contract()
    a = snapshot(c)
    assert json.dumps(snapshot(ContractSet(c))) == json.dumps(a)
    assert snapshot([c]) == a
    assert snapshot(c)["fingerprint"] == a["fingerprint"]


def test_fingerprint_changes_with_the_contract() -> None:
    assert snapshot(contract())["fingerprint"] != snapshot(contract(shards=2))["fingerprint"]


def test_snapshot_refuses_two_queues_with_one_name() -> None:
    with pytest.raises(ContractError, match="declared twice"):
        snapshot([contract(), contract()])


# -- compatible changes --------------------------------------------------------------------------


def test_identical_contracts_have_no_changes() -> None:
    assert changes(contract(), contract()) == []


def test_description_and_title_changes_pass_silently() -> None:
    described = evolved(count=(int, Field(description="how many", title="Count")))
    assert changes(contract(), contract(described)) == []


def test_new_optional_field_with_default_is_additive() -> None:
    found = changes(contract(), contract(evolved(source=(str | None, None))))
    assert kinds(found) == {("source", "field_added", False)}


def test_new_job_and_new_queue_are_additive() -> None:
    found = check_compatible(
        snapshot(contract()),
        snapshot([contract(extra_job=True), contract(name="exports")]),
    )
    assert {(c.queue, c.job, c.kind, c.breaking) for c in found} == {
        ("ingestion", "other-job", "job_added", False),
        ("exports", None, "queue_added", False),
    }


def test_widened_type_int_to_optional_int_is_additive() -> None:
    found = changes(contract(), contract(evolved(count=(int | None, ...))))
    assert kinds(found) == {("count", "type_widened", False)}


def test_widened_literal_and_relaxed_bound_are_additive() -> None:
    found = changes(
        contract(),
        contract(evolved(kind=(Literal["a", "b", "c"], "a"), size=(int, 0))),
    )
    assert kinds(found) == {
        ("kind", "enum_widened", False),
        ("size", "constraint_relaxed", False),
    }


def test_required_field_becoming_optional_is_additive() -> None:
    found = changes(contract(), contract(evolved(count=(int, 0))))
    assert ("count", "field_now_optional", False) in kinds(found)
    assert breaking(found) == []


def test_new_secondary_lane_and_changed_defaults_are_not_breaking() -> None:
    found = changes(contract(), contract(secondary_shards=2, defaults=JobDefaults(attempts=9)))
    assert {(c.kind, c.breaking) for c in found} == {
        ("secondary_added", False),
        ("defaults_changed", False),
    }


def test_renamed_model_class_with_the_same_shape_is_no_change() -> None:
    class Place(BaseModel):
        street: str
        zip: str

    assert changes(contract(), contract(evolved(address=(Place | None, None)))) == []


def test_recursive_model_compares_without_looping() -> None:
    class Tree2(BaseModel):
        value: int | None
        children: list[Tree2] = []

    found = changes(contract(), contract(evolved(tree=(Tree2 | None, None))))
    assert kinds(found) == {("tree.value", "type_widened", False)}


# -- breaking changes ----------------------------------------------------------------------------


def test_removed_queue_is_breaking() -> None:
    found = check_compatible(snapshot([contract(), contract(name="exports")]), snapshot(contract()))
    assert [(c.queue, c.kind, c.breaking) for c in found] == [("exports", "queue_removed", True)]


def test_removed_job_is_breaking() -> None:
    found = changes(contract(extra_job=True), contract())
    assert [(c.job, c.kind, c.breaking) for c in found] == [("other-job", "job_removed", True)]


def test_removed_field_is_breaking() -> None:
    found = changes(contract(), contract(evolved(note=None)))
    assert kinds(found) == {("note", "field_removed", True)}


def test_new_required_field_is_breaking() -> None:
    found = changes(contract(), contract(evolved(source=(str, ...))))
    assert kinds(found) == {("source", "field_added_required", True)}


def test_optional_field_becoming_required_is_breaking() -> None:
    found = changes(contract(), contract(evolved(note=(str | None, ...))))
    assert kinds(found) == {("note", "field_now_required", True)}


def test_changed_field_type_is_breaking() -> None:
    found = changes(contract(), contract(evolved(count=(str, ...))))
    assert kinds(found) == {("count", "type_changed", True)}
    assert "integer" in found[0].message
    assert "string" in found[0].message


def test_narrowed_optional_to_plain_type_is_breaking() -> None:
    found = changes(contract(), contract(evolved(at=(datetime, datetime(2024, 1, 1)))))
    assert ("at", "type_changed", True) in kinds(found)


def test_changed_format_datetime_to_date_is_breaking() -> None:
    found = changes(contract(), contract(evolved(at=(date | None, None))))
    assert kinds(found) == {("at", "type_changed", True)}


def test_changed_type_inside_a_nested_model_is_breaking() -> None:
    found = changes(contract(), contract(evolved(address=(AddressIntZip | None, None))))
    assert kinds(found) == {("address.zip", "type_changed", True)}


def test_changed_list_item_type_is_breaking() -> None:
    found = changes(contract(), contract(evolved(tags=(list[int], []))))
    assert kinds(found) == {("tags[]", "type_changed", True)}


def test_narrowed_enum_is_breaking() -> None:
    found = changes(contract(), contract(evolved(color=(OnlyRed, OnlyRed.red))))
    assert kinds(found) == {("color", "enum_narrowed", True)}
    assert '"blue"' in found[0].message


def test_narrowed_literal_is_breaking() -> None:
    found = changes(contract(), contract(evolved(kind=(Literal["a"], "a"))))
    assert kinds(found) == {("kind", "enum_narrowed", True)}


def test_tightened_bound_is_breaking() -> None:
    found = changes(contract(), contract(evolved(size=(int, Field(default=1, ge=1)))))
    assert ("size", "constraint_tightened", True) in kinds(found)


def test_changed_shard_count_is_breaking() -> None:
    found = changes(contract(shards=4), contract(shards=8))
    assert [(c.kind, c.breaking) for c in found] == [("shards_changed", True)]
    assert "4 to 8" in found[0].message


def test_changed_secondary_lane_shard_count_is_breaking() -> None:
    found = changes(contract(secondary_shards=2), contract(secondary_shards=3))
    assert [(c.kind, c.breaking) for c in found] == [("secondary_shards_changed", True)]


def test_removed_secondary_lane_is_breaking() -> None:
    found = changes(contract(secondary_shards=2), contract())
    assert [(c.kind, c.breaking) for c in found] == [("secondary_removed", True)]


def test_changed_tenant_field_is_breaking() -> None:
    found = changes(contract(), contract(tenant_field=None))
    assert [(c.kind, c.breaking) for c in found] == [("tenant_field_changed", True)]


# -- assert_compatible and errors ----------------------------------------------------------------


def test_assert_compatible_raises_listing_every_breaking_change() -> None:
    old = snapshot(contract(shards=2))
    new = snapshot(contract(evolved(note=None, count=(str, ...)), shards=3))
    with pytest.raises(IncompatibleContract) as info:
        assert_compatible(old, new)
    listed = "\n".join(info.value.changes)
    assert len(info.value.changes) == 3
    for word in ("shards_changed", "field_removed", "'note'", "type_changed", "'count'"):
        assert word in listed
        assert word in str(info.value)


def test_assert_compatible_returns_additive_changes() -> None:
    additive = assert_compatible(
        snapshot(contract()), snapshot(contract(evolved(source=(str | None, None))))
    )
    assert [c.kind for c in additive] == ["field_added"]


def test_check_refuses_what_is_not_a_snapshot() -> None:
    with pytest.raises(ContractError, match="not a streamq format 1 snapshot"):
        check_compatible({"format": 99, "queues": {}}, snapshot(contract()))


def test_change_reads_as_one_line() -> None:
    c = Change("ingestion", "ingest-event", "note", "field_removed", "gone", True)
    assert str(c) == "BREAKING field_removed: ingestion/ingest-event field 'note': gone"


def test_compat_api_is_exported() -> None:
    for name in ("snapshot", "check_compatible", "assert_compatible", "Change"):
        assert name in streamq.__all__
        assert getattr(streamq, name) is getattr(streamq.compat, name)


# -- command line --------------------------------------------------------------------------------

CONTRACTS_V1 = """
from pydantic import BaseModel
from streamq import ContractSet, QueueContract, job

class Event(BaseModel):
    project_id: str
    count: int
{extra}

class Ingestion(QueueContract, name="ingestion", shards={shards}):
    ingest = job("ingest-event", Event)

CONTRACTS = ContractSet(Ingestion)
"""


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamq.compat", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_snapshot(tmp: Path, module: str, *, shards: int = 1, extra: str = "") -> Path:
    (tmp / f"{module}.py").write_text(
        textwrap.dedent(CONTRACTS_V1.format(shards=shards, extra=extra))
    )
    done = run_cli(tmp, "snapshot", f"{module}:CONTRACTS")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no runpy warning about streamq.compat being imported twice
    out = tmp / f"{module}.json"
    out.write_text(done.stdout)
    return out


def test_cli_snapshot_then_check_exits_0_on_additive_and_1_on_breaking(tmp_path: Path) -> None:
    v1 = write_snapshot(tmp_path, "contracts_v1")
    assert json.loads(v1.read_text())["queues"]["ingestion"]["shards"] == 1
    additive = write_snapshot(tmp_path, "contracts_v2", extra="    source: str | None = None")
    broken = write_snapshot(tmp_path, "contracts_v3", shards=2)

    ok = run_cli(tmp_path, "check", str(v1), str(additive))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok field_added: ingestion/ingest-event field 'source'" in ok.stdout

    same = run_cli(tmp_path, "check", str(v1), str(v1))
    assert (same.returncode, same.stdout) == (0, "")

    bad = run_cli(tmp_path, "check", str(v1), str(broken))
    assert bad.returncode == 1
    assert "BREAKING shards_changed: ingestion" in bad.stdout
    assert "1 breaking change(s)" in bad.stderr


def test_cli_reports_a_bad_target_or_file_with_exit_2(tmp_path: Path) -> None:
    assert run_cli(tmp_path, "snapshot", "no_such_module:X").returncode == 2
    missing = run_cli(tmp_path, "check", "nope.json", "nope.json")
    assert missing.returncode == 2
    assert "error:" in missing.stderr


class Summary(BaseModel):
    total: int
    note: str | None = None


def result_contract(result: type[BaseModel] | None, **job_kw: Any) -> type[QueueContract]:
    attrs: dict[str, Any] = {"ingest": job("ingest-event", Event, result=result, **job_kw)}
    return type("Cres", (QueueContract,), attrs, name="ingestion", tenant_field="project_id")


def test_snapshot_names_the_result_model_only_when_one_is_declared() -> None:
    plain = snapshot(contract())["queues"]["ingestion"]["jobs"]["ingest-event"]
    assert "result" not in plain
    assert "tracking" not in plain
    snap = snapshot(result_contract(Summary))["queues"]["ingestion"]["jobs"]["ingest-event"]
    assert snap["result"]["model"].endswith("Summary")
    assert snap["result"]["schema"]["required"] == ["total"]
    assert snap["tracking"] == {"keep_result_ms": 3_600_000}


def test_removed_result_field_is_breaking_and_a_new_result_model_is_additive() -> None:
    slim = create_model("Summary", note=(str | None, None))
    assert kinds(changes(result_contract(Summary), result_contract(slim))) == {
        ("total", "result_field_removed", True)
    }
    assert kinds(changes(contract(), result_contract(Summary))) == {
        (None, "result_added", False), (None, "tracking_changed", False)
    }
    assert (None, "result_removed", True) in kinds(
        changes(result_contract(Summary), result_contract(None, keep_result=60))
    )
