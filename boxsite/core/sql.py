"""Every hand-written statement of the boxsite app, one named function each. Each is written once
per process (``functools.cache``), on paths every request or task creation takes, where the ORM
would build the same statement again at each call. The models come as parameters: the core
imports no app."""
from __future__ import annotations

import functools
from typing import TypeVar

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Model

from boxsite.core.db.rows import Rows, column

M = TypeVar("M", bound=Model)


def ping() -> None:
    """The health check's proof that the database answers."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def tables_in_schema() -> int:
    """How many tables the PostgreSQL database's current schema holds, of the box's or anyone's:
    a restore without ``--force`` goes only into an empty one (``boxsite.backups.database``)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()")
        return int(cursor.fetchone()[0])


def locked_row(model: type[M], pk: int) -> M | None:
    """``model``'s row ``pk``, locked until the transaction ends where the database has row locks
    (SQLite's write transaction holds the whole database): the settings row, at every creation."""
    statement, rows = _locked_row(model, connection.vendor)
    found = rows.fetch_one(statement, [pk])
    if found is None:
        return None
    (row,) = found
    assert isinstance(row, model)
    return row


@functools.cache
def _locked_row(model: type[Model], vendor: str) -> tuple[str, Rows]:
    rows = Rows.of(model)
    quote = connection.ops.quote_name
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    return (f"SELECT {rows.columns()} FROM {quote(model._meta.db_table)} "
            f"WHERE {quote(column(model, model._meta.pk.name))} = %s{lock}"), rows


def credential_with_user(model: type[M], key_hash: str) -> M | None:
    """The unrevoked ``model`` row (a token, a device) with the key hash ``key_hash``, its user
    read with it (``.user``): every request asks once."""
    statement, rows = _credential(model, connection.vendor)
    found = rows.fetch_one(statement, [key_hash])
    if found is None:
        return None
    credential, user = found
    assert isinstance(credential, model) and isinstance(user, get_user_model())
    credential.user = user  # type: ignore[attr-defined]
    return credential


@functools.cache
def _credential(model: type[Model], vendor: str) -> tuple[str, Rows]:
    """The join of ``model``'s row and its user's, by the key's hash (unique)."""
    quote = connection.ops.quote_name
    user_model = get_user_model()
    rows = Rows.of(model, user_model)
    own, users = quote(model._meta.db_table), quote(user_model._meta.db_table)
    user_id, key_hash, revoked_at = (quote(column(model, name)) for name in ("user", "key_hash", "revoked_at"))
    user_pk = quote(column(user_model, user_model._meta.pk.name))
    return (f"SELECT {rows.columns()} FROM {own} INNER JOIN {users} ON {own}.{user_id} = {users}.{user_pk} "
            f"WHERE {own}.{key_hash} = %s AND {own}.{revoked_at} IS NULL"), rows
