"""The attack tests use the sandbox tests' fixture: the ``box`` with the real sandbox on."""
from __future__ import annotations

from tests.sandbox.conftest import sandboxed  # a fixture, found by name

__all__ = ["sandboxed"]
