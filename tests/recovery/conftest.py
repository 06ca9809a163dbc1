"""Recovery tests share the runbox tests' box environment (embedded, and PostgreSQL + Redis)."""
from tests.test_runbox import box_env  # noqa: F401 - a fixture, offered to this package's tests
