"""Response shapes: the presenters' typed output turned into the schema's components.

A presenter module declares what it returns as ``TypedDict``s beside its functions; mypy holds
each presenter to its declaration, and this module turns the declarations into JSON Schema
(OpenAPI 3.1), so the schema is derived from the code that builds the bodies and cannot drift
from it. A view names its response with ``shape(TaskView)``; the schema's post-processing
(``boxsite.core.schema``) adds every shape so named, and the shapes they reach, as components.

How Python types read as JSON Schema:

- ``str``, ``int``, ``float``, ``bool``, ``None``; ``X | None`` is nullable; ``Any`` is any JSON.
- ``list[X]``; ``dict[str, X]`` is an object whose values are ``X``.
- ``Literal["a", "b"]`` and ``Annotated[str, SomeTextChoices]`` are enums.
- ``Annotated[T, Doc("...")]`` describes a property; ``Annotated[T, Raw({...})]`` gives its
  schema outright (the flow language, built from ``tasks.spec.flows``).
- a ``TypedDict`` is a component, closed (no other keys) unless passed to ``leave_open``;
  ``NotRequired`` keys are optional. ``chosen_by(Event, "kind", "data", {...})`` makes the type
  of one property follow the value of another (an event's data per kind).
"""
from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, Required, Union, get_args, get_origin

REF = "#/components/schemas/"


@dataclass(frozen=True)
class Doc:
    text: str


@dataclass(frozen=True)
class Format:
    name: str


@dataclass(frozen=True)
class Raw:
    schema: dict[str, Any]


DateTime = Annotated[str, Format("date-time")]

_named: dict[str, type] = {}
_open: set[type] = set()
_chosen: dict[type, tuple[str, str, dict[str, Any]]] = {}


def leave_open(typed_dict: type) -> None:
    """``typed_dict`` may carry keys beyond the declared ones (an error's extra context)."""
    _open.add(typed_dict)


def chosen_by(typed_dict: type, key: str, prop: str, shapes: dict[str, Any]) -> None:
    """In ``typed_dict``, the value of ``key`` selects the type of ``prop`` (values not in
    ``shapes`` keep the declared type)."""
    _chosen[typed_dict] = (key, prop, shapes)


def shape(typed_dict: type) -> dict[str, Any]:
    """The schema of a response body of ``typed_dict``: a reference to its component."""
    _remember(typed_dict)
    return {"$ref": REF + typed_dict.__name__}


def _remember(typed_dict: type) -> None:
    known = _named.setdefault(typed_dict.__name__, typed_dict)
    if known is not typed_dict:
        raise TypeError(f"two response shapes are named {typed_dict.__name__} ({known.__module__}, {typed_dict.__module__})")


def components() -> dict[str, dict[str, Any]]:
    """Every shape named by ``shape()`` and every shape they reach, by name."""
    out: dict[str, dict[str, Any]] = {}
    pending = list(_named.values())
    while pending:
        typed_dict = pending.pop()
        if typed_dict.__name__ in out:
            continue
        reached: list[type] = []
        out[typed_dict.__name__] = _object_schema(typed_dict, reached)
        pending += reached
    return dict(sorted(out.items()))


def _object_schema(typed_dict: type, reached: list[type]) -> dict[str, Any]:
    hints = typing.get_type_hints(typed_dict, include_extras=True)
    # Read from the hints, not ``__required_keys__``: under postponed annotations Python 3.11
    # cannot see a NotRequired when it builds the class.
    required = [k for k, t in hints.items() if get_origin(t) is not NotRequired
                and (get_origin(t) is Required or typed_dict.__total__)]  # type: ignore[attr-defined]
    schema: dict[str, Any] = {"type": "object", "properties": {k: schema_of(t, reached) for k, t in hints.items()},
                              "required": required}
    if typed_dict.__doc__ and typed_dict.__doc__ != dict.__doc__ and not typed_dict.__doc__.startswith(typed_dict.__name__ + "("):
        schema["description"] = " ".join(typed_dict.__doc__.split())
    if typed_dict not in _open:
        schema["additionalProperties"] = False
    if typed_dict in _chosen:
        key, prop, shapes = _chosen[typed_dict]
        schema["allOf"] = [{"if": {"properties": {key: {"const": getattr(value, "value", value)}}, "required": [key]},
                            "then": {"properties": {prop: schema_of(kind, reached)}}}
                           for value, kind in shapes.items()]
    return schema


def schema_of(tp: Any, reached: list[type] | None = None) -> dict[str, Any]:
    """The JSON Schema of a Python type (see the module's docstring); TypedDicts met on the way
    are appended to ``reached`` and referenced."""
    reached = [] if reached is None else reached
    origin, args = get_origin(tp), get_args(tp)
    if origin in (NotRequired, Required):
        return schema_of(args[0], reached)
    if origin is Annotated:
        base = schema_of(args[0], reached)
        for meta in tp.__metadata__:
            if isinstance(meta, Raw):
                base = dict(meta.schema)
            elif isinstance(meta, Doc):
                base["description"] = meta.text
            elif isinstance(meta, Format):
                base["format"] = meta.name
            elif isinstance(meta, type) and issubclass(meta, enum.Enum):
                base["enum"] = [m.value for m in meta] + ([None] if _nullable(base) else [])
        return base
    if tp is Any:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    if tp in _PLAIN:
        return {"type": _PLAIN[tp]}
    if origin is Literal:
        return {"type": _PLAIN[type(args[0])], "enum": list(args)}
    if origin in (Union, types.UnionType):
        return _union([schema_of(a, reached) for a in args])
    if origin is list:
        return {"type": "array", "items": schema_of(args[0], reached)}
    if origin is dict:
        return {"type": "object"} if args[1] is Any else {"type": "object", "additionalProperties": schema_of(args[1], reached)}
    if typing.is_typeddict(tp):
        _remember(tp)
        reached.append(tp)
        return {"$ref": REF + tp.__name__}
    raise TypeError(f"no JSON Schema for {tp!r}")


_PLAIN = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _nullable(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return isinstance(kind, list) and "null" in kind


def _union(members: list[dict[str, Any]]) -> dict[str, Any]:
    """``X | None`` as a type list where X is a plain type (so a format or an enum stays beside
    it); otherwise one of the members."""
    plain = [m for m in members if m != {"type": "null"}]
    if len(plain) == 1 and len(members) == 2 and isinstance(plain[0].get("type"), str):
        merged = {**plain[0], "type": [plain[0]["type"], "null"]}
        if "enum" in merged:
            merged["enum"] = [*merged["enum"], None]
        return merged
    if any(m == {} for m in members):
        return {}
    return {"anyOf": members}

