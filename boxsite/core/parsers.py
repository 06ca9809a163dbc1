"""The API's one request parser: JSON, bounded in size and depth, holding only what the
databases store.

Every API body goes through ``BoxJSONParser`` (it is the only parser DRF is given), so these
limits hold for every endpoint at once: a body over ``BOX_API_MAX_BYTES`` is ``413``, JSON
nested deeper than ``MAX_JSON_DEPTH``, holding a NUL character (which PostgreSQL cannot store
in text), a lone surrogate (``"\\ud800"``: valid JSON, not encodable as UTF-8) or a number
too large for a float (``1e309`` reads as infinity, which no JSON column or answer can hold) is
``400`` naming where, and nothing reaches a view that the databases cannot store.
"""
from __future__ import annotations

import json
import math
from typing import IO, Any

from django.conf import settings
from rest_framework.parsers import BaseParser

from boxsite.core.errors import InvalidRequest, PayloadTooLarge

MAX_JSON_DEPTH = 64


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def storable_text(text: str) -> bool:
    """No NUL and no lone surrogate: text both databases store as it was given."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_json_value(data: Any, *, root: str = "") -> None:
    """Refuse nesting deeper than ``MAX_JSON_DEPTH``, NUL characters and lone surrogates in
    keys or strings, and numbers beyond a float's range.

    Iterative, so a hostile document cannot exhaust the stack while it is being checked.
    """
    stack: list[tuple[Any, str, int]] = [(data, root, 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if not storable_text(value):
                raise InvalidRequest(_unstorable(value, "text"), field=path or None)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidRequest("the number is too large (beyond a float's range)", field=path or None)
        elif isinstance(value, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise InvalidRequest(f"the JSON is nested more than {MAX_JSON_DEPTH} levels deep", field=path or None)
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                name = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and not storable_text(key):
                    raise InvalidRequest(_unstorable(key, "a name"), field=path or None)
                stack.append((item, name, depth + 1))


def _unstorable(text: str, what: str) -> str:
    if "\x00" in text:
        return f"{what} must not contain NUL characters (\\u0000)"
    return f"{what} must not contain a lone surrogate (\\ud800-\\udfff): it is not Unicode text"


def load_json(raw: bytes) -> Any:
    """Parse ``raw`` as strict JSON (no NaN/Infinity), then ``check_json_value`` it."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise InvalidRequest("the body is not UTF-8 text", field="body") from exc
    except RecursionError as exc:
        raise InvalidRequest(f"the JSON is nested more than {MAX_JSON_DEPTH} levels deep", field="body") from exc
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}", field="body") from exc
    check_json_value(data)
    return data


class BoxJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None) -> Any:
        if stream is None:
            return {}
        limit = settings.BOX_API_MAX_BYTES
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise PayloadTooLarge(f"the body is larger than {limit} bytes", field="body")
        if not raw.strip():
            return {}
        return load_json(raw)
