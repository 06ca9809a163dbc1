"""The box's database backends: Django's own, with what the box needs on top."""
from __future__ import annotations

from django.db import OperationalError, connection

# PostgreSQL's answers to a transaction it chose to abort so others could go on (a deadlock, a
# serialisation failure): nothing of it was written, so it may run again.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})


def may_run_again(exc: OperationalError) -> bool:
    """Whether the transaction ``exc`` ended may simply run again: PostgreSQL aborted it for
    others' sake, and it was the outermost one (a caller's transaction is aborted with it)."""
    return getattr(exc.__cause__, "sqlstate", None) in RETRYABLE_SQLSTATES and not connection.in_atomic_block
