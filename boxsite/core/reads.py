"""Reads taken once per operation: one request, one task's creation.

The settings row and the vault's values are read by many small checks of one operation (each
spec field's default, the capacity check, every redactor); inside ``read_once`` each is read the
first time it is asked for and kept until the operation ends. A write in the same operation drops
what it changed (``forget``), so the operation sees its own writes. Outside a scope nothing is
kept. The scope is a context variable: each thread and each asyncio task has its own.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

_held: ContextVar[dict[str, Any] | None] = ContextVar("box_reads_held", default=None)


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """Open a scope (or join the one already open)."""
    if _held.get() is not None:
        yield
        return
    token = _held.set({})
    try:
        yield
    finally:
        _held.reset(token)


def held(name: str, load: Callable[[], T]) -> T:
    """``load()``, once per scope for ``name``; every time outside one."""
    scope = _held.get()
    if scope is None:
        return load()
    if name not in scope:
        scope[name] = load()
    return scope[name]


def keep(name: str, value: Any) -> None:
    """``value`` is what ``name`` now holds (its writer has it in hand)."""
    scope = _held.get()
    if scope is not None:
        scope[name] = value


def forget(name: str) -> None:
    """``name`` was written: read it again next time it is asked for."""
    scope = _held.get()
    if scope is not None:
        scope.pop(name, None)
