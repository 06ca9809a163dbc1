"""Keyset pagination whose opaque cursor binds the sort it was made for.

A cursor made for one ordering is refused for another, so changing the sort can never reuse a
stale position. Nullable sort columns order NULLs last in both directions on every database.
Cursors are signed: one the box did not make (forged, edited, truncated) is refused as such,
so no value from a client ever reaches the keyset filter.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core import signing
from django.db.models import F, Q, QuerySet

from boxsite.core.errors import InvalidRequest


@dataclass(frozen=True)
class Sort:
    name: str  # what the client passes, e.g. "-created"
    field: str  # the model field, e.g. "created_at"
    descending: bool
    nullable: bool = False


_CURSOR_SALT = "boxsite.core.pagination.cursor"


def _encode(payload: dict[str, Any]) -> str:
    return signing.dumps(payload, salt=_CURSOR_SALT, compress=True)


def _decode(cursor: str) -> dict[str, Any]:
    try:
        payload = signing.loads(cursor, salt=_CURSOR_SALT)
    except (signing.BadSignature, ValueError) as exc:
        raise InvalidRequest("the cursor is not one this API made", field="cursor") from exc
    if not isinstance(payload, dict):
        raise InvalidRequest("the cursor is not one this API made", field="cursor")
    return payload


def _value(obj: Any, field: str) -> Any:
    value = getattr(obj, field)
    return value.isoformat() if isinstance(value, datetime) else value


def page(qs: QuerySet[Any], sorts: dict[str, Sort], sort_name: str, cursor: str | None, limit: int) -> tuple[list[Any], str | None]:
    """One page of ``qs`` in the chosen order, and the cursor of the next page (or None)."""
    sort = sorts.get(sort_name)
    if sort is None:
        raise InvalidRequest(f"unknown sort '{sort_name}' (one of {', '.join(sorts)})", field="sort")
    f = F(sort.field)
    # NULLS LAST only where there can be NULLs: on a NOT NULL column it would keep PostgreSQL from
    # reading the order from an index (scanned either way), and every page would sort the rows.
    nulls_last = True if sort.nullable else None
    order = [f.desc(nulls_last=nulls_last) if sort.descending else f.asc(nulls_last=nulls_last),
             "-pk" if sort.descending else "pk"]
    qs = qs.order_by(*order)
    if cursor:
        payload = _decode(cursor)
        if payload.get("sort") != sort.name:
            raise InvalidRequest(f"this cursor was made for sort '{payload.get('sort')}', not '{sort.name}'", field="cursor")
        value, pk = payload.get("v"), payload.get("pk")
        after_pk = Q(pk__lt=pk) if sort.descending else Q(pk__gt=pk)
        if value is None:
            # Already among the NULLs (last): only NULL rows with a later pk remain.
            qs = qs.filter(Q(**{f"{sort.field}__isnull": True}) & after_pk)
        else:
            beyond = Q(**{f"{sort.field}__lt" if sort.descending else f"{sort.field}__gt": value})
            same = Q(**{sort.field: value}) & after_pk
            if sort.nullable:
                qs = qs.filter(beyond | same | Q(**{f"{sort.field}__isnull": True}))
            else:
                # The bound alone is what an index can seek to: a page deep in the list starts
                # there instead of reading (and dropping) every row before it.
                bound = Q(**{f"{sort.field}__lte" if sort.descending else f"{sort.field}__gte": value})
                qs = qs.filter(bound, beyond | same)
    rows = list(qs[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = _encode({"sort": sort.name, "v": _value(rows[-1], sort.field), "pk": rows[-1].pk}) if more and rows else None
    return rows, next_cursor


def limit_param(raw: str | None, default: int = 50, maximum: int = 200) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise InvalidRequest("'limit' must be a whole number", field="limit") from exc
    if not 1 <= value <= maximum:
        raise InvalidRequest(f"'limit' must be between 1 and {maximum}", field="limit")
    return value
