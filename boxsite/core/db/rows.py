"""Model rows read by statements written once per process, made into instances as the ORM makes
them (each column through the backend's and the field's converters: SQLite's datetimes are text,
its booleans numbers, JSON is decoded). For the few reads every request or task creation makes,
where the ORM would build the same statement again each time."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Field, Model
from django.db.models.expressions import Col


def column(model: type[Model], name: str) -> str:
    """The column of ``model``'s field ``name``."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column is not None
    return field.column


@dataclass(frozen=True)
class Rows:
    """How to read the concrete columns of ``models``, one after another, from a row."""

    models: tuple[type[Model], ...]
    readers: tuple[tuple[tuple[Col, tuple[Any, ...]], ...], ...]

    @classmethod
    def of(cls, *models: type[Model]) -> Rows:
        """Build once per process and database (its converters are the connection's)."""
        return cls(models, tuple(tuple(_reader(f) for f in model._meta.concrete_fields) for model in models))

    @classmethod
    def only(cls, model: type[Model], names: Sequence[str]) -> Rows:
        """Only the fields ``names`` of ``model``, as ``QuerySet.only`` reads them: an instance's
        other fields are deferred (each read from the database when first used)."""
        named = {model._meta.get_field(name) for name in names}
        assert all(isinstance(f, Field) and f.concrete for f in named)
        # In the model's order, not the names': ``Model.from_db`` matches values to fields in it.
        return cls((model,), (tuple(_reader(f) for f in model._meta.concrete_fields if f in named),))

    def columns(self) -> str:
        """The select list: each column read, qualified by its table."""
        quote = connection.ops.quote_name
        return ", ".join(f"{quote(col.alias)}.{quote(column(col.target.model, col.target.name))}"
                         for readers in self.readers for col, _ in readers)

    def fetch_one(self, statement: str, params: Sequence[Any]) -> list[Model] | None:
        """The instances of the first row ``statement`` finds, or None when it finds none."""
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            row = cursor.fetchone()
        return None if row is None else self.instances(row)

    def instances(self, row: Sequence[Any]) -> list[Model]:
        """One instance per model from ``row``, as a query of the ORM would have made each."""
        made, start = [], 0
        for model, readers in zip(self.models, self.readers, strict=True):
            values = []
            for value, (col, converters) in zip(row[start:start + len(readers)], readers, strict=True):
                for convert in converters:
                    value = convert(value, col, connection)
                values.append(value)
            made.append(model.from_db(connection.alias, [col.target.attname for col, _ in readers], values))
            start += len(readers)
        return made


def _reader(field: Field[Any, Any]) -> tuple[Col, tuple[Any, ...]]:
    col = field.cached_col
    return col, (*connection.ops.get_db_converters(col), *col.get_db_converters(connection))
