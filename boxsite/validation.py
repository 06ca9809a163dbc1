"""The one check every request body gets before its fields are read: it is a JSON object and
holds only the fields the endpoint takes. The fields are those its request body declares in
``boxsite.schema`` (``fields_of``), so the schema and the check cannot drift apart."""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from rest_framework.serializers import Serializer

from boxsite.errors import BoxError, InvalidRequest


def fields_of(declared: type[Serializer[Any]]) -> frozenset[str]:
    """The field names a request body serializer in ``boxsite.schema`` declares."""
    return frozenset(declared().fields)


def check_fields(body: Any, allowed: Iterable[str], *, error: type[BoxError] = InvalidRequest,
                 hints: Mapping[str, str] | None = None, what: str = "the body") -> dict[str, Any]:
    """``body`` as a dict, or ``error`` naming the first field the endpoint does not take."""
    if not isinstance(body, dict):
        raise error(f"{what} must be a JSON object")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        hint = (hints or {}).get(unknown[0])
        raise error(f"unknown field '{unknown[0]}'" + (f" (did you mean '{hint}'?)" if hint else ""), field=unknown[0])
    return body


def existing_dir(value: Any, field: str, *, error: type[BoxError] = InvalidRequest) -> str:
    """``value`` as the real path of an existing directory given by its absolute path (folders
    a task works on, a watched folder, a directory to import), or ``error`` naming ``field``."""
    if not isinstance(value, str) or not value or not os.path.isabs(value):
        raise error(f"'{value}' is not an absolute path" if isinstance(value, str) and value
                    else f"'{field}' must be an absolute path", field=field)
    if not os.path.isdir(value):
        raise error(f"'{value}' is not an existing directory", field=field)
    return os.path.realpath(value)
