"""Comparing two payload JSON schemas for backward compatibility (private to compat).

Walks both schemas together, resolving ``$ref`` into ``$defs``, and reports each difference
as a ``_Diff``: breaking when a value the old schema accepted would be refused by the new one,
or a field an old reader needs is gone; additive otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamq.errors import ContractError

Json = dict[str, Any]

ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly"}
)



def canonical_json(obj: Any) -> str:
    """Compact JSON with sorted keys: equal values give equal text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True, slots=True)
class _Node:
    """A JSON schema, the ``$defs`` its refs point into, and the name of the definition it
    was resolved from (a model or enum name), if any."""

    schema: Json
    defs: Json
    ref: str | None = None

    def resolve(self) -> _Node:
        """Follow ``$ref`` (and pydantic's single-item ``allOf``)."""
        s, ref = self.schema, self.ref
        for _ in range(64):
            if "$ref" in s:
                ref = str(s["$ref"]).rsplit("/", 1)[-1]
                target = self.defs.get(ref)
                if target is None:
                    raise ContractError(f"schema reference {s['$ref']!r} has no definition")
                s = {**target, **{k: v for k, v in s.items() if k != "$ref"}}
            elif isinstance(s.get("allOf"), list) and len(s["allOf"]) == 1:
                s = {**s["allOf"][0], **{k: v for k, v in s.items() if k != "allOf"}}
            else:
                break
        return _Node(s, self.defs, ref)

    def alternatives(self) -> list[_Node]:
        """The branches of an ``anyOf``/``oneOf``/type list, each resolved, flattened."""
        node = self.resolve()
        s = node.schema
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list):
                rest = {k: v for k, v in s.items() if k != key and k not in ANNOTATIONS}
                out: list[_Node] = []
                for branch in s[key]:
                    out.extend(_Node({**rest, **branch}, self.defs).alternatives())
                return out
        if isinstance(s.get("type"), list):
            return [_Node({**s, "type": t}, self.defs, node.ref) for t in s["type"]]
        return [node]


@dataclass(frozen=True, slots=True)
class _Diff:
    field: str
    kind: str
    message: str
    breaking: bool


def _kind(s: Json) -> str:
    """``object`` (a model), ``dict`` (a mapping), ``array`` or ``scalar``."""
    if "properties" in s:
        return "object"
    if s.get("type") == "object":
        return "dict"
    if s.get("type") == "array":
        return "array"
    return "scalar"


def _values(s: Json) -> list[Any] | None:
    if "const" in s:
        return [s["const"]]
    if isinstance(s.get("enum"), list):
        return list(s["enum"])
    return None


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _type_accepts(new_type: Any, old_type: Any) -> bool:
    return new_type is None or new_type == old_type or (new_type, old_type) == ("number", "integer")


def _numeric_bound(s: Json, incl: str, excl: str, lower: bool) -> tuple[float, bool] | None:
    """The tighter of a schema's inclusive and exclusive bound: (value, exclusive)."""
    cands = [(float(s[incl]), False)] if incl in s else []
    if excl in s:
        cands.append((float(s[excl]), True))
    if not cands:
        return None
    return max(cands) if lower else min(cands, key=lambda c: (c[0], not c[1]))


def _numeric_accepts(new: Json, old: Json, incl: str, excl: str, lower: bool) -> bool:
    """Whether ``new``'s lower (or upper) bound admits every value ``old``'s admits."""
    nb = _numeric_bound(new, incl, excl, lower)
    ob = _numeric_bound(old, incl, excl, lower)
    if nb is None:
        return True
    if ob is None:
        return False
    if nb[0] != ob[0]:
        return nb[0] < ob[0] if lower else nb[0] > ob[0]
    return not nb[1] or ob[1]


def _size_accepts(new: Json, old: Json, key: str, lower: bool) -> bool:
    if key not in new:
        return True
    if key not in old:
        return False
    return bool(new[key] <= old[key]) if lower else bool(new[key] >= old[key])


_SIZES = (
    ("minLength", True),
    ("maxLength", False),
    ("minItems", True),
    ("maxItems", False),
    ("minProperties", True),
    ("maxProperties", False),
)


def _constraints_accept(new: Json, old: Json) -> bool:
    """Whether ``new``'s constraints admit every value ``old``'s admit (same base type)."""
    for key in ("format", "pattern"):
        if key in new and new[key] != old.get(key):
            return False
    if "multipleOf" in new and (
        "multipleOf" not in old or float(old["multipleOf"]) % float(new["multipleOf"]) != 0
    ):
        return False
    return (
        _numeric_accepts(new, old, "minimum", "exclusiveMinimum", True)
        and _numeric_accepts(new, old, "maximum", "exclusiveMaximum", False)
        and all(_size_accepts(new, old, key, lower) for key, lower in _SIZES)
    )


def _value_fits(new: Json, v: Any) -> bool:
    """Whether the scalar schema ``new`` admits the literal value ``v``."""
    values = _values(new)
    if values is not None:
        return any(v == x and type(v) is type(x) for x in values)
    t = new.get("type")
    if t is not None and not _type_accepts(t, _json_type(v)):
        return False
    if "format" in new:
        return False  # a format cannot be checked on a literal here: assume it narrows
    if isinstance(v, str):
        if not new.get("minLength", 0) <= len(v) <= new.get("maxLength", len(v)):
            return False
        pattern = new.get("pattern")
        try:
            return pattern is None or re.search(pattern, v) is not None
        except re.error:
            return False  # a pattern Python cannot read: assume it narrows
    if isinstance(v, int | float) and not isinstance(v, bool):
        point = {"minimum": v, "maximum": v}
        return _numeric_accepts(new, point, "minimum", "exclusiveMinimum", True) and (
            _numeric_accepts(new, point, "maximum", "exclusiveMaximum", False)
        )
    return True


def _scalar_accepts(new: Json, old: Json) -> bool:
    """Whether every value the scalar schema ``old`` admits is admitted by ``new``."""
    new_values, old_values = _values(new), _values(old)
    if old_values is not None:
        return all(_value_fits(new, v) for v in old_values)
    if new_values is not None:
        return False
    return _type_accepts(new.get("type"), old.get("type")) and _constraints_accept(new, old)


def _describe(nodes: Sequence[_Node]) -> str:
    parts = []
    for n in nodes:
        s = n.schema
        values = _values(s)
        if values is not None:
            parts.append("one of " + json.dumps(values))
        else:
            t = str(s.get("type", "any"))
            if "format" in s:
                t += f"({s['format']})"
            parts.append(t)
    return " | ".join(sorted(set(parts))) or "any"


class _Comparer:
    """Walks two payload schemas side by side and collects field-level differences."""

    def __init__(self, active: set[tuple[str, str]] | None = None) -> None:
        self.out: list[_Diff] = []
        # Model pairs being compared further up the stack: a recursive model stops here.
        self._active: set[tuple[str, str]] = active if active is not None else set()

    def add(self, field: str, kind: str, message: str, *, breaking: bool) -> None:
        self.out.append(_Diff(field, kind, message, breaking))

    def compare(self, old: _Node, new: _Node, path: str) -> None:
        o_alts, n_alts = old.alternatives(), new.alternatives()
        if any(not _strip(a.schema) for a in n_alts):
            return  # the new schema accepts anything
        o_rest, n_rest = list(o_alts), list(n_alts)
        # One model (or list, or dict) on each side, e.g. Optional[Address]: compare field by
        # field to name every nested change.
        for kind in ("object", "dict", "array"):
            o_k = [a for a in o_rest if _kind(a.schema) == kind]
            n_k = [a for a in n_rest if _kind(a.schema) == kind]
            if len(o_k) == 1 and len(n_k) == 1:
                self._compare_structured(kind, o_k[0], n_k[0], path)
                o_rest.remove(o_k[0])
                n_rest.remove(n_k[0])
        lost = [o for o in o_rest if not any(self._accepts(n, o, path) for n in n_rest)]
        if lost:
            self._narrowed(lost, o_alts, n_alts, path)
        elif sorted(canonical_json(_strip(a.schema)) for a in o_rest) != sorted(
            canonical_json(_strip(a.schema)) for a in n_rest
        ):
            old_v = [v for a in o_rest for v in (_values(a.schema) or [])]
            new_v = [v for a in n_rest for v in (_values(a.schema) or [])]
            before, after = _describe(o_alts), _describe(n_alts)
            if old_v and new_v:
                kind, what = "enum_widened", f"widened from {before} to {after}"
            elif before == after:
                kind, what = "constraint_relaxed", f"constraints relaxed ({after})"
            else:
                kind, what = "type_widened", f"widened from {before} to {after}"
            self.add(
                path,
                kind,
                f"{what}: deploy workers before producers send the new values",
                breaking=False,
            )

    def _accepts(self, new: _Node, old: _Node, path: str) -> bool:
        """Whether the branch ``new`` admits every value of the branch ``old``."""
        kind = _kind(old.schema)
        if kind != _kind(new.schema):
            return False
        if kind == "scalar":
            return _scalar_accepts(new.schema, old.schema)
        # A union of several models: a branch matches when it has no breaking difference.
        sub = _Comparer(set(self._active))
        sub._compare_structured(kind, old, new, path)
        return not any(d.breaking for d in sub.out)

    def _narrowed(
        self, lost: list[_Node], o_alts: list[_Node], n_alts: list[_Node], path: str
    ) -> None:
        n_types = {(a.schema.get("type"), a.schema.get("format")) for a in n_alts}
        lost_enum = [a for a in lost if _values(a.schema) is not None]
        if lost_enum and len(lost_enum) == len(lost) and any(_values(a.schema) for a in n_alts):
            gone = [
                v
                for a in lost
                for v in (_values(a.schema) or [])
                if not any(_value_fits(n.schema, v) for n in n_alts)
            ]
            self.add(
                path,
                "enum_narrowed",
                f"values {json.dumps(gone)} are no longer accepted (in-flight jobs may hold them)",
                breaking=True,
            )
        elif all((a.schema.get("type"), a.schema.get("format")) in n_types for a in lost):
            self.add(
                path,
                "constraint_tightened",
                f"constraints tightened ({_describe(lost)}): values valid before may be refused",
                breaking=True,
            )
        else:
            self.add(
                path,
                "type_changed",
                f"type changed from {_describe(o_alts)} to {_describe(n_alts)}",
                breaking=True,
            )

    def _compare_structured(self, kind: str, old: _Node, new: _Node, path: str) -> None:
        o, n = old.resolve(), new.resolve()
        key = (o.ref or "", n.ref or "")
        if o.ref and n.ref:
            if key in self._active:
                return  # a recursive model: this pair is already being compared above
            self._active.add(key)
        try:
            self._compare_body(kind, o, n, path)
        finally:
            self._active.discard(key)

    def _compare_body(self, kind: str, o: _Node, n: _Node, path: str) -> None:
        if kind == "object":
            self._compare_objects(o, n, path)
            return
        if not _constraints_accept(n.schema, o.schema):
            self.add(path, "constraint_tightened", "size constraints tightened", breaking=True)
        if kind == "array":
            oi, ni = o.schema.get("items", {}), n.schema.get("items", {})
            self.compare(_Node(oi, o.defs), _Node(ni, n.defs), f"{path}[]")
        else:
            oa, na = (
                o.schema.get("additionalProperties", {}),
                n.schema.get("additionalProperties", {}),
            )
            if isinstance(oa, dict) and isinstance(na, dict):
                self.compare(_Node(oa, o.defs), _Node(na, n.defs), f"{path}{{}}")

    def _compare_objects(self, old: _Node, new: _Node, path: str) -> None:
        o_props: Json = old.schema.get("properties", {})
        n_props: Json = new.schema.get("properties", {})
        o_req = set(old.schema.get("required", []))
        n_req = set(new.schema.get("required", []))
        for name in o_props:
            f = f"{path}.{name}" if path else name
            if name not in n_props:
                self.add(
                    f,
                    "field_removed",
                    "field removed: jobs in flight still carry it and workers still running "
                    "the old contract expect it",
                    breaking=True,
                )
                continue
            if name in n_req and name not in o_req:
                self.add(
                    f,
                    "field_now_required",
                    "an optional field became required: payloads that omit it are refused",
                    breaking=True,
                )
            elif name in o_req and name not in n_req:
                self.add(
                    f, "field_now_optional", "a required field became optional", breaking=False
                )
            od, nd = o_props[name].get("default"), n_props[name].get("default")
            if "default" in o_props[name] and "default" in n_props[name] and od != nd:
                self.add(
                    f,
                    "default_changed",
                    f"default changed from {json.dumps(od)} to {json.dumps(nd)}",
                    breaking=False,
                )
            self.compare(_Node(o_props[name], old.defs), _Node(n_props[name], new.defs), f)
        for name in n_props:
            if name in o_props:
                continue
            f = f"{path}.{name}" if path else name
            if name in n_req:
                self.add(
                    f,
                    "field_added_required",
                    "new required field: jobs from older producers do not have it",
                    breaking=True,
                )
            else:
                self.add(f, "field_added", "new optional field", breaking=False)


def _strip(s: Json) -> Json:
    return {k: v for k, v in s.items() if k not in ANNOTATIONS}


def schema_diffs(old: Json, new: Json) -> list[_Diff]:
    c = _Comparer()
    c.compare(_Node(old, old.get("$defs", {})), _Node(new, new.get("$defs", {})), "")
    return c.out
