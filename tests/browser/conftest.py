"""Browser tests: real Chromium (Debian's) in each task's sandbox, local sites on the host."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tasks.browser.binary import missing_reason
from tests.browser.sites import Site, serve
from tests.pauses.conftest import _release_what_tests_leave_waiting  # noqa: F401 - autouse
from tests.sandbox.conftest import sandboxed  # noqa: F401 - fixture


@pytest.fixture
def site() -> Iterator[Site]:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with serve() as running:
        yield running
