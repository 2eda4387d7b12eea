"""Contract declarations are validated when the module declaring them is imported."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from streamq import ContractError, ContractSet, JobDefaults, JobSpec, Lane, QueueContract, job
from streamq.contracts import DEFAULT_MAX_PAYLOAD_BYTES


class Event(BaseModel):
    project_id: str
    event_id: str


class Other(BaseModel):
    project_id: str
    n: int = 0


class Ingestion(
    QueueContract, name="ingestion", shards=3, secondary_shards=2, tenant_field="project_id"
):
    ingest_event = job("ingest-event", Event)
    other = job("other-thing", Other)


def declare(name: str = "q", model: type[BaseModel] = Event, **kw: Any) -> type[QueueContract]:
    class C(QueueContract, name=name, **kw):
        a = job("a", model)

    return C


def test_contract_exposes_its_declaration() -> None:
    assert Ingestion.queue_name == "ingestion"
    assert Ingestion.shards == 3
    assert Ingestion.secondary_shards == 2
    assert Ingestion.tenant_field == "project_id"
    assert set(Ingestion.jobs) == {"ingest-event", "other-thing"}
    assert Ingestion.job_spec("ingest-event") is Ingestion.ingest_event
    assert Ingestion.job_spec("nope") is None
    assert Ingestion.ingest_event.queue is Ingestion
    assert Ingestion.ingest_event.model is Event
    assert repr(Ingestion.ingest_event) == "JobSpec(ingestion/ingest-event, Event)"


def test_defaults_apply_when_not_given() -> None:
    c = declare()
    assert c.defaults == JobDefaults()
    assert c.defaults.attempts == 3
    assert c.defaults.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 1024 * 1024
    assert c.shards == 1
    assert c.secondary is None
    assert c.secret_fields == frozenset()


def test_shard_names_follow_queue_then_queue_dash_index() -> None:
    assert Ingestion.shard_names() == ["ingestion", "ingestion-1", "ingestion-2"]
    assert Ingestion.primary.shard_names() == Ingestion.shard_names()
    assert Ingestion.secondary is not None
    assert Ingestion.secondary.shard_names() == ["ingestion-secondary", "ingestion-secondary-1"]


def test_lanes_are_primary_then_secondary() -> None:
    primary, secondary = Ingestion.lanes()
    assert primary == Lane(Ingestion, "ingestion", 3)
    assert secondary == Lane(Ingestion, "ingestion-secondary", 2, secondary=True)
    plain = declare()
    assert plain.lanes() == (plain.primary,)


def test_lane_shard_for_is_stable_and_in_range() -> None:
    lane = Ingestion.primary
    for key in ("a", "project-1", "x" * 300, "ünïcode"):
        idx = lane.shard_for(key)
        assert 0 <= idx < 3
        assert lane.shard_for(key) == idx


@pytest.mark.parametrize(
    "name", ["Ingestion", "has_underscore", "a--b", "-a", "a-", "", "spaces here", "é"]
)
def test_queue_name_outside_lowercase_digits_dash_is_refused(name: str) -> None:
    with pytest.raises(ContractError, match="name"):
        declare(name)


@pytest.mark.parametrize("name", ["Ingest", "ingest_event", "a.b", "", "x/y"])
def test_job_name_outside_lowercase_digits_dash_is_refused(name: str) -> None:
    with pytest.raises(ContractError, match="job name"):
        job(name, Event)


@pytest.mark.parametrize("shards", [0, -1, 1.5, "2", True])
def test_shards_below_one_or_not_an_integer_is_refused(shards: Any) -> None:
    with pytest.raises(ContractError, match="shards must be an integer >= 1"):
        declare(shards=shards)


@pytest.mark.parametrize("shards", [0, -3])
def test_secondary_shards_below_one_is_refused(shards: int) -> None:
    with pytest.raises(ContractError, match="secondary_shards"):
        declare(secondary_shards=shards)


def test_duplicate_job_name_in_one_queue_is_refused() -> None:
    with pytest.raises(ContractError, match="'a' is declared twice") as info:

        class C(QueueContract, name="dup-jobs"):
            one = job("a", Event)
            two = job("a", Other)

    assert info.value.queue == "dup-jobs"


def test_one_job_spec_in_two_queues_is_refused() -> None:
    shared = job("shared", Event)

    class A(QueueContract, name="a"):
        s = shared

    with pytest.raises(ContractError, match="already belongs to queue 'a'"):

        class B(QueueContract, name="b"):
            s = shared


def test_queue_without_jobs_is_refused() -> None:
    with pytest.raises(ContractError, match="declares no jobs"):

        class C(QueueContract, name="empty"):
            pass


def test_payload_model_forbidding_extra_fields_is_refused() -> None:
    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")
        a: int

    with pytest.raises(ContractError, match="Strict forbids extra fields"):
        job("strict", Strict)


def test_nested_model_forbidding_extra_fields_is_refused() -> None:
    class Inner(BaseModel):
        model_config = ConfigDict(extra="forbid")
        a: int

    class Outer(BaseModel):
        items: list[Inner | None] = []

    with pytest.raises(ContractError, match="Inner forbids extra fields"):
        job("outer", Outer)


def test_payload_that_is_not_a_pydantic_model_is_refused() -> None:
    with pytest.raises(ContractError, match="pydantic BaseModel"):
        job("plain", dict)  # type: ignore[type-var]


def test_tenant_field_missing_from_a_job_model_is_refused() -> None:
    with pytest.raises(ContractError, match="tenant_field 'project_id' is not a field") as info:

        class C(QueueContract, name="tenants", tenant_field="project_id"):
            ok = job("ok", Event)
            missing = job("missing", BaseModel)

    assert info.value.job == "missing"
    assert info.value.queue == "tenants"


def test_refused_declaration_leaves_its_job_specs_free() -> None:
    spec = job("reusable", Event)
    with pytest.raises(ContractError):

        class Bad(QueueContract, name="bad", tenant_field="nope"):
            s = spec

    assert spec.queue is None

    class Good(QueueContract, name="good"):
        s = spec

    assert spec.queue is Good


def test_defaults_must_be_job_defaults() -> None:
    with pytest.raises(ContractError, match="JobDefaults"):
        declare(defaults={"attempts": 2})


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"attempts": 0}, "attempts"),
        ({"dedup_window": 0}, "dedup_window must be at least 1 ms"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
    ],
)
def test_job_defaults_refuse_non_positive_values(kw: dict[str, int], match: str) -> None:
    with pytest.raises(ContractError, match=match):
        JobDefaults(**kw)


def test_contract_set_refuses_two_queues_with_one_name() -> None:
    a, b = declare("same"), declare("same")
    with pytest.raises(ContractError, match="'same' is declared twice"):
        ContractSet(a, b)


def test_contract_set_refuses_a_queue_named_like_another_secondary_lane() -> None:
    with_secondary = declare("ingest", secondary_shards=1)
    clash = declare("ingest-secondary")
    with pytest.raises(ContractError, match="'ingest-secondary' is declared twice"):
        ContractSet(with_secondary, clash)
    with pytest.raises(ContractError, match="'ingest-secondary' is declared twice"):
        ContractSet(clash, with_secondary)


def test_contract_set_refuses_a_queue_named_like_another_queue_shard() -> None:
    with pytest.raises(ContractError, match="shard name 'jobs-1'"):
        ContractSet(declare("jobs", shards=2), declare("jobs-1"))


def test_contract_set_refuses_what_is_not_a_contract() -> None:
    with pytest.raises(ContractError, match="not a QueueContract"):
        ContractSet(Event)  # type: ignore[arg-type]


def test_contract_set_iterates_contracts_once_and_finds_lanes_by_name() -> None:
    plain = declare("plain")
    cs = ContractSet(Ingestion, plain)
    assert list(cs) == [Ingestion, plain]
    assert len(cs) == 2
    assert [lane.name for lane in cs.lanes()] == ["ingestion", "ingestion-secondary", "plain"]
    assert cs.lane("ingestion-secondary") is Ingestion.secondary
    assert cs.lane("plain") is plain.primary
    with pytest.raises(ContractError, match="no queue named 'nope'"):
        cs.lane("nope")


def test_job_returns_a_typed_spec() -> None:
    spec = job("typed", Event)
    assert isinstance(spec, JobSpec)
    assert spec.name == "typed"
    assert spec.queue is None
