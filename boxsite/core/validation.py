"""Request bodies are declared serializers, and the declaration is what checks them.

A body is a ``Body`` (a DRF serializer) whose fields are the box's own field classes below. The
same declaration does three things: ``Body.parse`` refuses a body that is not an object or holds
a field the body does not declare (the one unknown-field check), each field checks its own value
and drf-spectacular turns the
declaration into the request schema served at ``/api/schema/``.

Checking runs in declaration order and stops at the first problem, which it names (dotted, as
``constraints.payment``) in the box's error shape. A check that needs other fields or the box's
state is a method ``check_<field>(value, seen)`` on the body: it runs right after that field's
own check, for every declared field whether given or not (``value`` is ``MISSING`` when absent),
sees the fields before it in ``seen`` and returns the value to keep (``MISSING`` keeps nothing).
Adding a field to a body is therefore one declaration (plus its ``check_`` method when it needs
context) — see docs/internals/task-lifecycle.md#adding-a-field-to-the-task-spec.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers as s

from boxsite.core.errors import BoxError, InvalidRequest, NotAvailable

MAX_WHOLE = 2**31 - 1  # the largest number an integer column holds on every database


def time_zone_named(name: object) -> ZoneInfo | None:
    """The IANA zone ``name`` names, or None. ZoneInfo reads the name as a file: a directory
    ("America") or a name too long for one is an OSError there, not a ZoneInfoNotFoundError."""
    if not isinstance(name, str):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


class _Missing:
    """A field the body does not give (false, like an empty value)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class Problem(Exception):
    """A field's value is wrong: the body turns it into its error class, naming the field."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BoxField:
    """What the box's fields add to DRF's: ``check(value, name)``, strict (no coercion of "5"
    to 5 or "true" to True), with the box's messages. ``invalid`` replaces the message of a
    wrong type or shape; ``{name}`` in it is the dotted field name."""

    invalid: str | None = None

    def check(self, value: Any, name: str) -> Any:
        raise NotImplementedError

    def _fail(self, default: str, name: str) -> Problem:
        return Problem((self.invalid or default).format(name=name))


class Text(BoxField, s.CharField):
    """A string. ``required``: present and not blank. ``pattern``: the whole value matches."""

    def __init__(self, *, invalid: str | None = None, pattern: str | None = None, max_length: int = 100_000,
                 length_message: str | None = None, **kwargs: Any) -> None:
        self.invalid = invalid
        self.length_message = length_message
        self.regex = re.compile(pattern) if pattern else None
        kwargs.setdefault("allow_blank", not kwargs.get("required", True))
        super().__init__(max_length=max_length, **kwargs)

    def check(self, value: Any, name: str) -> Any:
        if value is None:
            if self.required:
                raise self._fail("'{name}' is required", name)
            return ""
        if not isinstance(value, str):
            raise self._fail("'{name}' must be a string", name)
        if self.regex is not None and not self.regex.match(value):
            raise self._fail("'{name}' is not in the expected form", name)
        if self.required and not value.strip():
            raise self._fail("'{name}' must not be empty", name)
        if self.max_length is not None and len(value) > self.max_length:
            raise Problem(self.length_message or f"'{name}' is longer than {self.max_length} characters")
        if self.min_length is not None and len(value) < self.min_length:
            raise Problem(self.length_message or f"'{name}' is shorter than {self.min_length} characters")
        return value


class Whole(BoxField, s.IntegerField):
    """A whole number (never a bool or a float) from ``min_value`` to ``max_value``.
    ``between``: one message for both ends ("must be between a and b")."""

    def __init__(self, *, invalid: str | None = None, between: bool = False, min_value: int = 0,
                 max_value: int = MAX_WHOLE, **kwargs: Any) -> None:
        self.invalid = invalid
        self.between = between
        super().__init__(min_value=min_value, max_value=max_value, **kwargs)

    def check(self, value: Any, name: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail("'{name}' must be a whole number", name)
        low, high = int(self.min_value or 0), int(self.max_value if self.max_value is not None else MAX_WHOLE)
        if self.invalid and not low <= value <= high:
            raise self._fail("", name)
        if self.between and not low <= value <= high:
            raise Problem(f"'{name}' must be between {low} and {high}")
        if value < low:
            raise Problem(f"'{name}' must be at least {low}")
        if value > high:
            raise Problem(f"'{name}' must be at most {high}")
        return value


class Number(BoxField, s.FloatField):
    """A number (whole or not, never a bool) from ``min_value`` to ``max_value``."""

    def __init__(self, *, invalid: str | None = None, **kwargs: Any) -> None:
        self.invalid = invalid
        super().__init__(**kwargs)

    def check(self, value: Any, name: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self._fail("'{name}' must be a number", name)
        if (self.min_value is not None and value < self.min_value) or (self.max_value is not None and value > self.max_value):
            raise self._fail(f"'{{name}}' must be a number from {self.min_value:g} to {self.max_value:g}", name)
        return float(value)


class Flag(BoxField, s.BooleanField):
    def __init__(self, *, invalid: str | None = None, **kwargs: Any) -> None:
        self.invalid = invalid
        super().__init__(**kwargs)

    def check(self, value: Any, name: str) -> Any:
        if not isinstance(value, bool):
            raise self._fail("'{name}' must be true or false", name)
        return value


class Choice(BoxField, s.ChoiceField):
    def __init__(self, choices: list[str], *, invalid: str | None = None, **kwargs: Any) -> None:
        self.invalid = invalid
        super().__init__(choices=choices, **kwargs)

    def check(self, value: Any, name: str) -> Any:
        if not isinstance(value, str) or value not in self.choices:
            raise self._fail(f"'{{name}}' must be one of {', '.join(self.choices)}", name)
        return value


class Names(BoxField, s.ListField):
    """A list of non-empty strings, each kept once (first place wins)."""

    def __init__(self, *, invalid: str | None = None, dedupe: bool = True, blank_ok: bool = False, **kwargs: Any) -> None:
        self.invalid = invalid
        self.dedupe = dedupe
        self.blank_ok = blank_ok
        super().__init__(child=s.CharField(allow_blank=blank_ok), **kwargs)

    def check(self, value: Any, name: str) -> Any:
        if not isinstance(value, list) or not all(isinstance(v, str) and (v or self.blank_ok) for v in value):
            raise self._fail("'{name}' must be a list of non-empty strings", name)
        return list(dict.fromkeys(value)) if self.dedupe else list(value)


class Anything(BoxField, s.JSONField):
    """Any JSON value; its body's ``check_`` method says what it must be."""

    def __init__(self, *, invalid: str | None = None, **kwargs: Any) -> None:
        self.invalid = invalid
        super().__init__(**kwargs)

    def check(self, value: Any, name: str) -> Any:
        return value


@extend_schema_field({"type": "object", "additionalProperties": True})
class Obj(Anything):
    """A JSON object, checked by its body's ``check_`` method or by the code it is handed to."""


@extend_schema_field({"type": "string"})
class AnyText(Anything):
    """Text, checked by the code it is handed to (which names its own problems)."""


@extend_schema_field({"type": "integer"})
class AnyWhole(Anything):
    """A whole number, checked by the code it is handed to."""


@extend_schema_field({"type": ["number", "null"]})
class AnyNumber(Anything):
    """A number (or null), checked by the code it is handed to."""


@extend_schema_field({"type": "object", "additionalProperties": {"type": ["string", "number", "boolean", "null"]}})
class Plain(Anything):
    """An object of plain values (text, numbers, true/false, null)."""

    def check(self, value: Any, name: str) -> Any:
        if not isinstance(value, dict) or not all(isinstance(v, (str, int, float, bool)) or v is None for v in value.values()):
            raise self._fail("'{name}' must be an object of plain values", name)
        return value


class Body(s.Serializer):
    """A request body: see the module's docstring. Subclasses set ``error`` (the error class
    of a bad value), ``what`` (how a message names the whole body), ``hints`` (unknown name ->
    the field meant), ``unknown`` (the message for an undeclared field) and ``later`` (fields
    the box will take once what they promise exists: refused as NOT_AVAILABLE, each with why)."""

    error: ClassVar[type[BoxError]] = InvalidRequest
    what: ClassVar[str] = "the body"
    hints: ClassVar[Mapping[str, str]] = {}
    unknown: ClassVar[str] = "unknown field '{name}'"
    not_object: ClassVar[str] = "{what} must be a JSON object"
    later: ClassVar[Mapping[str, str]] = {}
    prefix: ClassVar[str] = ""  # a nested body's dotted name, as "constraints."

    @classmethod
    def names(cls) -> frozenset[str]:
        """The fields this body declares."""
        return frozenset(cls().fields)

    @classmethod
    def parse(cls, data: Any, *, only: frozenset[str] | None = None, **context: Any) -> dict[str, Any]:
        """``data`` checked: the declared fields given (``only``: of these) and what their
        ``check_`` methods add. Raises the body's error naming the first problem."""
        body = cls(context=context)
        return body.check_all(data, only)

    def get_fields(self) -> dict[str, s.Field]:
        """The declared fields, each a shallow copy for this body to bind. DRF deep-copies them,
        building every field again, for each body made, on the path of every request
        (docs/internals/decisions-performance.md#performance); the box's fields keep nothing of a
        check but the ``given`` of a nested body, set on its own copy."""
        return {name: _copy(field) for name, field in self._declared_fields.items()}

    def check_all(self, data: Any, only: frozenset[str] | None = None) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.error(self.not_object.format(what=self.what), field=self.prefix.rstrip(".") or None)
        self.given = data
        later = sorted(set(data) & set(self.later))
        if later:
            name = self.prefix + later[0]
            raise NotAvailable(f"'{name}' is not available yet: {self.later[later[0]]}", field=name)
        declared: list[str] = [name for name in self.fields.keys() if only is None or name in only]
        unknown = sorted(set(data) - set(declared))
        if unknown:
            hint = self.hints.get(unknown[0])
            raise self.error(self.unknown.format(name=unknown[0]) + (f" (did you mean '{hint}'?)" if hint else ""),
                             field=self.prefix + unknown[0])
        seen: dict[str, Any] = {}
        for name in declared:
            field = self.fields[name]
            dotted = self.prefix + name
            value = data.get(name, MISSING)
            try:
                if value is None and field.allow_null:
                    pass
                elif value is not MISSING:
                    value = self._check_field(field, value, dotted)
                elif field.required:
                    raise Problem((getattr(field, "invalid", None) or "'{name}' is required").format(name=dotted))
                hook: Callable[[Any, dict[str, Any]], Any] | None = getattr(self, f"check_{name}", None)
                if hook is not None:
                    value = hook(value, seen)
            except Problem as problem:
                raise self.error(problem.message, field=dotted) from None
            if value is not MISSING:
                seen[name] = value
        return seen

    def model_values(self, checked: Mapping[str, Any]) -> dict[str, Any]:
        """``checked`` keyed by the model's names (each field's ``source``) instead of the API's."""
        return {str(self.fields[name].source): value for name, value in checked.items()}

    def _check_field(self, field: Any, value: Any, dotted: str) -> Any:
        if isinstance(field, Body):
            return field.check_all(value)
        if isinstance(field, BoxField):
            return field.check(value, dotted)
        raise TypeError(f"{type(self).__name__}.{field.field_name} is not one of the box's field classes")


def _copy(field: s.Field) -> s.Field:
    fresh = object.__new__(type(field))
    fresh.__dict__.update(field.__dict__)
    return fresh


def existing_dir(value: Any, field: str, *, error: type[BoxError] = InvalidRequest) -> str:
    """``value`` as the real path of an existing directory given by its absolute path (folders a
    task works on, a watched folder, a directory to import), or ``error`` naming ``field``. The
    one folder-path check."""
    if not isinstance(value, str) or not value or not os.path.isabs(value):
        raise error(f"'{value}' is not an absolute path" if isinstance(value, str) and value
                    else f"'{field}' must be an absolute path", field=field)
    if not os.path.isdir(value):
        raise error(f"'{value}' is not an existing directory", field=field)
    return os.path.realpath(value)
