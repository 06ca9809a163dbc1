"""The layer drivers (both, for ownership) and the cleanup of tasks a test leaves waiting."""
from tests.layers.conftest import driver, lbox  # noqa: F401 - shared fixtures
from tests.pauses.conftest import _release_what_tests_leave_waiting  # noqa: F401 - autouse
