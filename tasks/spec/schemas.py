"""Checking a JSON Schema a spec carries (a ``model`` step's, an ``extract``'s, a task's answer)."""
from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a JSON Schema the box can check an answer against, or None."""
    if not isinstance(schema, dict):
        return "a schema is an object"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return exc.message
    return None
