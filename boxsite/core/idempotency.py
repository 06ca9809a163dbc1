"""Idempotent creation: a ``POST`` that creates (a task, a schedule, a trigger) made again with
the same ``Idempotency-Key`` answers with what the first one made instead of making another.

The key is scoped to the caller (one API token, one paired phone, the owner's browser sessions)
and to the operation, and lives for ``LIFETIME``. The same key with another body is a conflict
(409): the client reused a key for a different request, and guessing which one it meant would be
wrong either way. A creation that fails takes no key: its rollback removes the key's row too.

A replay is presented from the created object as it is now (docs/internals/decisions.md), with
``Idempotent-Replayed: true``.

Two requests with one key at once create once. The key's row is inserted first, in the
transaction that then creates the object: on PostgreSQL the second insert waits on the unique
index until the first transaction ends, then fails (and the second request reads the first's
row) or, if the first rolled back, goes on as the only one. On SQLite the second transaction
cannot even begin before the first commits: every write transaction holds the writer gate
(``boxsite.core.db.sqlite``), so it finds the row at once.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from django.db import IntegrityError, OperationalError, transaction
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.request import Request
from rest_framework.response import Response

from boxsite.core.db import may_run_again
from boxsite.core.errors import Conflict, ErrorBody, InvalidRequest
from boxsite.core.principal import Principal, Via
from boxsite.core.shapes import shape
from boxsite.models import IdempotencyKey

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
LIFETIME = timedelta(hours=24)
MAX_LENGTH = 255
ATTEMPTS = 3  # runs of a creation PostgreSQL aborted for others' sake (a deadlock)
FIELD = HEADER  # the error shape's ``field`` for a fault in the header

T = TypeVar("T")

# What the three creating operations add to their schema.
PARAMETERS = [
    OpenApiParameter(
        HEADER, str, OpenApiParameter.HEADER,
        description=("1 to 255 printable ASCII characters. The same key with the same body within 24 hours "
                     "answers with what the first request created, and creates nothing; with another body it "
                     "is 409. Scoped to the caller (the token, the phone, the owner's sessions).")),
    OpenApiParameter(REPLAYED, str, OpenApiParameter.HEADER, response=[201], enum=["true"],
                     description="present on the answer to a repeated Idempotency-Key: nothing new was created"),
]
REUSED = OpenApiResponse(
    response=shape(ErrorBody),
    description=("the Idempotency-Key was used with another body (IDEMPOTENCY_KEY_REUSED), or what it "
                 "created is gone; or the thing is not in a state that allows this now"),
)


@dataclass(frozen=True)
class Created(Generic[T]):
    """What a creating request answers with, and whether an earlier request made it."""

    value: T
    replayed: bool


def key_of(request: Request) -> str | None:
    """The request's Idempotency-Key, checked; None without the header."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    if not 1 <= len(raw) <= MAX_LENGTH or not all(" " <= c <= "~" for c in raw):
        raise InvalidRequest(f"{HEADER} must be 1 to {MAX_LENGTH} printable ASCII characters", field=FIELD)
    return raw


def caller_of(principal: Principal) -> str:
    """Whose keys these are: each token and each phone has its own; the owner's sessions share."""
    if principal.via == Via.TOKEN and principal.token is not None:
        return f"token:{principal.token.pk}"
    if principal.via == Via.DEVICE and principal.device is not None:
        return f"device:{principal.device.pk}"
    if principal.via == Via.TASK and principal.task is not None:
        return f"task:{principal.task.pk}"
    return f"{principal.via}:{principal.user.pk}"


def body_digest(body: Any) -> str:
    """The digest of the body as data: key order and spacing do not make another body."""
    if hasattr(body, "lists"):  # a form's QueryDict: every value of every field
        body = {name: values for name, values in body.lists()}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def create_once(request: Request, principal: Principal, operation: str, make: Callable[[], T], *,
                ident: Callable[[T], str], find: Callable[[str], T | None]) -> Created[T]:
    """``make()`` once per Idempotency-Key of this caller and ``operation``; a repeat answers
    ``find(id)`` of what the first made (``ident`` gives that id). Without the header, ``make()``."""
    key = key_of(request)
    if key is None:
        return Created(make(), replayed=False)
    caller, digest = caller_of(principal), body_digest(request.data)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return _create_under_key(principal, operation, caller, key, digest, make, ident=ident, find=find)
        except OperationalError as exc:
            # The creation runs in this transaction, so its own retry (``create_task``'s) is this.
            if not may_run_again(exc) or attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


@transaction.atomic
def _create_under_key(principal: Principal, operation: str, caller: str, key: str, digest: str,
                      make: Callable[[], T], *, ident: Callable[[T], str], find: Callable[[str], T | None]) -> Created[T]:
    mine = IdempotencyKey.objects.filter(caller=caller, operation=operation, key=key)
    mine.filter(created_at__lte=timezone.now() - LIFETIME).delete()  # expired: the key is free again
    try:
        with transaction.atomic():  # a savepoint: the failed insert leaves the transaction usable
            row = IdempotencyKey.objects.create(owner=principal.user, caller=caller, operation=operation,
                                                key=key, body_digest=digest)
    except IntegrityError:
        first = mine.get()
        if first.body_digest != digest:
            raise Conflict(f"{HEADER} '{key}' was already used with another body; use a new key for another "
                           "request", field=FIELD, code="IDEMPOTENCY_KEY_REUSED") from None
        found = find(first.result_id)
        if found is None:
            raise Conflict(f"what {HEADER} '{key}' created is gone; use a new key", field=FIELD) from None
        return Created(found, replayed=True)
    value = make()
    IdempotencyKey.objects.filter(pk=row.pk).update(result_id=ident(value))
    return Created(value, replayed=False)


def answer(body: Any, created: Created[Any], status: int = 201) -> Response:
    """The creating request's response; a replay says so in a header."""
    response = Response(body, status=status)
    if created.replayed:
        response[REPLAYED] = "true"
    return response


def forget_expired(now: datetime | None = None) -> int:
    """Remove keys past ``LIFETIME`` (the retention job); returns how many."""
    cutoff = (now or timezone.now()) - LIFETIME
    return IdempotencyKey.objects.filter(created_at__lte=cutoff).delete()[0]
