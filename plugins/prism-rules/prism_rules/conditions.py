"""Rule conditions: a small MongoDB-like query language, compiled once at start-up.

A ``when`` table maps fields to tests; every entry must hold::

    when = { "org.tags" = "eu", "metadata.tier" = { "$in" = ["gold", "platinum"] } }

Fields: ``org.tags`` and ``key.scopes`` (sets of names), ``org.name`` and
``model`` (names), ``metadata.<key>`` (the caller's metadata values).  Field
operators: ``$eq $ne $in $nin $exists $gt $gte $lt $lte $not``; a bare value
means ``$eq``.  Combinators at the top of a ``when`` (and inside them):
``$and $or`` (lists of ``when`` tables) and ``$not`` (one table).

Semantics worth knowing:
- a missing value (metadata key not sent, ``org.name`` of an anonymous
  caller) equals nothing, not even null, so ``$eq``/``$in``/``$gt``… fail and
  their negations ``$ne``/``$nin`` hold;
- on a set field, ``$eq x`` means "contains x", ``$in`` "contains any of",
  ``$ne``/``$nin`` their negations, ``$exists true`` "is not empty";
- equality is typed: ``"1"`` is not ``1`` and ``true`` is not ``1``;
  ``1`` equals ``1.0``; ``$gt``… hold only for numbers.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

__all__ = [
    "MISSING",
    "Condition",
    "ConditionError",
    "Context",
    "FIELD_OPERATORS",
    "LOGICAL_OPERATORS",
    "Primitive",
    "compile_when",
]

Primitive = str | int | float | bool | None


class _Missing(enum.Enum):
    MISSING = "missing"


MISSING = _Missing.MISSING
Value = Primitive | frozenset[str] | _Missing

FIELD_OPERATORS = (
    "$eq",
    "$ne",
    "$in",
    "$nin",
    "$exists",
    "$gt",
    "$gte",
    "$lt",
    "$lte",
    "$not",
)
LOGICAL_OPERATORS = ("$and", "$or", "$not")
_SET_FIELDS = frozenset({"org.tags", "key.scopes"})
_NAME_FIELDS = frozenset({"org.name", "model"})
METADATA_PREFIX = "metadata."
KNOWN_FIELDS = "org.tags, key.scopes, org.name, model, metadata.<key>"


class ConditionError(ValueError):
    """A mistake in a ``when`` table; ``path`` says where inside it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@attrs.frozen
class Context:
    """What rules may look at for one call."""

    org_name: str | None
    org_tags: frozenset[str]
    scopes: frozenset[str]
    model: str
    metadata: Mapping[str, Primitive]

    def value(self, field: str) -> Value:
        if field.startswith(METADATA_PREFIX):
            return self.metadata.get(field[len(METADATA_PREFIX) :], MISSING)
        if field == "org.tags":
            return self.org_tags
        if field == "key.scopes":
            return self.scopes
        if field == "model":
            return self.model
        return MISSING if self.org_name is None else self.org_name


class Condition(Protocol):
    def matches(self, ctx: Context) -> bool: ...


# --- evaluation -------------------------------------------------------------

ValueTest = Callable[[Value], bool]


def _same(a: Primitive, b: Primitive) -> bool:
    """Typed equality: bools only equal bools, numbers compare by value, strings exactly."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _eq(operand: Primitive) -> ValueTest:
    def test(value: Value) -> bool:
        if value is MISSING:
            return False
        if isinstance(value, frozenset):
            return isinstance(operand, str) and operand in value
        return _same(value, operand)

    return test


def _in(operands: tuple[Primitive, ...]) -> ValueTest:
    def test(value: Value) -> bool:
        if value is MISSING:
            return False
        if isinstance(value, frozenset):
            return any(isinstance(o, str) and o in value for o in operands)
        return any(_same(value, o) for o in operands)

    return test


def _exists(wanted: bool) -> ValueTest:
    def test(value: Value) -> bool:
        present = bool(value) if isinstance(value, frozenset) else value is not MISSING
        return present is wanted

    return test


_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def _compare(op: str, operand: float) -> ValueTest:
    check = _COMPARE[op]

    def test(value: Value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return check(value, operand)

    return test


def _negate(inner: ValueTest) -> ValueTest:
    return lambda value: not inner(value)


def _all(tests: Sequence[ValueTest]) -> ValueTest:
    return lambda value: all(test(value) for test in tests)


@attrs.frozen
class FieldTest:
    field: str
    test: ValueTest = attrs.field(repr=False)
    #: For a plain ``$eq``/``$in`` test: the values it can hold for (what a rule index keys on).
    equals: tuple[Primitive, ...] | None = None

    def matches(self, ctx: Context) -> bool:
        return self.test(ctx.value(self.field))


def guard(condition: Condition) -> FieldTest | None:
    """A field test the condition cannot hold without: a plain ``$eq``/``$in`` on a field,
    alone or in an ``$and`` (directly or at the top of the ``when``).  None: no such test."""
    if isinstance(condition, FieldTest):
        return condition if condition.equals is not None else None
    if isinstance(condition, AllOf):
        for part in condition.parts:
            found = guard(part)
            if found is not None:
                return found
    return None


def equality_key(value: Primitive) -> tuple[str, Primitive]:
    """Values equal under the conditions' typed equality share a key (1 and 1.0 do;
    true and 1 do not)."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", float(value))
    return ("s" if isinstance(value, str) else "z", value)


@attrs.frozen
class AllOf:
    parts: tuple[Condition, ...]

    def matches(self, ctx: Context) -> bool:
        return all(part.matches(ctx) for part in self.parts)


@attrs.frozen
class AnyOf:
    parts: tuple[Condition, ...]

    def matches(self, ctx: Context) -> bool:
        return any(part.matches(ctx) for part in self.parts)


@attrs.frozen
class NoneOf:
    part: Condition

    def matches(self, ctx: Context) -> bool:
        return not self.part.matches(ctx)


# --- compilation ------------------------------------------------------------


def compile_when(doc: Any, path: str = "when") -> Condition:
    """Check a ``when`` table and turn it into a condition; raises ``ConditionError``."""
    if not isinstance(doc, Mapping):
        raise ConditionError(path, f"expected a table of conditions, got {_show(doc)}")
    parts: list[Condition] = []
    for key, value in doc.items():
        where = f"{path}.{key}"
        if not isinstance(key, str):
            raise ConditionError(path, f"field names are strings, got {key!r}")
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise ConditionError(where, "expected a non-empty list of condition tables")
            members = tuple(compile_when(item, f"{where}[{i}]") for i, item in enumerate(value))
            parts.append(AllOf(members) if key == "$and" else AnyOf(members))
        elif key == "$not":
            parts.append(NoneOf(compile_when(value, where)))
        elif key.startswith("$"):
            raise ConditionError(
                where, f"unknown operator {key} here (known: {', '.join(LOGICAL_OPERATORS)})"
            )
        else:
            kind = _field_kind(key, where)
            parts.append(
                FieldTest(key, _compile_field(kind, value, where), _equals(kind, value, where))
            )
    # An empty table holds always: a catch-all rule.
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))


def _field_kind(field: str, where: str) -> str:
    if field in _SET_FIELDS:
        return "set"
    if field in _NAME_FIELDS:
        return "name"
    if field.startswith(METADATA_PREFIX) and len(field) > len(METADATA_PREFIX):
        return "metadata"
    raise ConditionError(where, f"unknown field {field!r} (known: {KNOWN_FIELDS})")


def _equals(kind: str, spec: Any, where: str) -> tuple[Primitive, ...] | None:
    """The values a plain ``$eq``/``$in`` (or bare value) test holds for; None otherwise."""
    if not isinstance(spec, Mapping):
        return (_operand(kind, spec, where),)
    if len(spec) != 1:
        return None
    ((op, operand),) = spec.items()
    if op == "$eq":
        return (_operand(kind, operand, f"{where}.$eq"),)
    if op == "$in" and isinstance(operand, list) and operand:
        return tuple(_operand(kind, item, f"{where}.$in[{i}]") for i, item in enumerate(operand))
    return None


def _compile_field(kind: str, spec: Any, where: str) -> ValueTest:
    if not isinstance(spec, Mapping):
        return _eq(_operand(kind, spec, where))
    if not spec:
        raise ConditionError(where, "empty table: give a value or operators like $eq")
    tests: list[ValueTest] = []
    for op, operand in spec.items():
        at = f"{where}.{op}"
        if op not in FIELD_OPERATORS:
            if isinstance(op, str) and op.startswith("$"):
                raise ConditionError(
                    at, f"unknown operator {op} (known: {', '.join(FIELD_OPERATORS)})"
                )
            raise ConditionError(
                at, f"expected operators like $eq or $in, got {op!r} (values cannot be tables)"
            )
        tests.append(_compile_operator(kind, op, operand, at))
    return tests[0] if len(tests) == 1 else _all(tests)


def _compile_operator(kind: str, op: str, operand: Any, at: str) -> ValueTest:
    if op in ("$eq", "$ne"):
        test = _eq(_operand(kind, operand, at))
        return test if op == "$eq" else _negate(test)
    if op in ("$in", "$nin"):
        if not isinstance(operand, list) or not operand:
            raise ConditionError(at, f"expected a non-empty list, got {_show(operand)}")
        test = _in(tuple(_operand(kind, item, f"{at}[{i}]") for i, item in enumerate(operand)))
        return test if op == "$in" else _negate(test)
    if op == "$exists":
        if not isinstance(operand, bool):
            raise ConditionError(at, f"expected true or false, got {_show(operand)}")
        return _exists(operand)
    if op == "$not":
        return _negate(_compile_field(kind, operand, at))
    # $gt $gte $lt $lte
    if kind != "metadata":
        raise ConditionError(at, f"{op} compares numbers; this field holds names")
    if isinstance(operand, bool) or not isinstance(operand, (int, float)):
        raise ConditionError(at, f"{op} compares numbers, got {_show(operand)}")
    if not math.isfinite(operand):
        raise ConditionError(at, f"{op} needs a finite number, got {operand!r}")
    return _compare(op, float(operand))


def _operand(kind: str, value: Any, at: str) -> Primitive:
    if isinstance(value, list):
        raise ConditionError(at, "a list is not a value: use { $in = [...] }")
    if kind != "metadata":
        if not isinstance(value, str):
            raise ConditionError(at, f"expected a name (string), got {_show(value)}")
        return value
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise ConditionError(at, f"expected a string, number, true/false or null, got {_show(value)}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
