"""Browser tests: real Chromium (Debian's) in each task's sandbox, local sites on the host."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tasks.browser.binary import missing_reason
from tests.browser.sites import Site, serve
from tests.pauses.conftest import _release_what_tests_leave_waiting  # noqa: F401 - autouse
from tests.sandbox.conftest import sandboxed  # noqa: F401 - fixture


@pytest.fixture
def chromium() -> None:
    """The test starts a real browser: it skips where the box has none."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def site(chromium: None) -> Iterator[Site]:
    with serve() as running:
        yield running


@pytest.fixture(autouse=True)
def stand_in_browser(request: pytest.FixtureRequest, settings: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """What a spec may ask of the browser is checked against the box's Chromium, which need only
    exist: where it is missing, a stand-in executable lets those checks run. A test that starts
    a browser asks for ``chromium`` (its site does), which skips instead."""
    if "chromium" in request.fixturenames or missing_reason() is None:
        return
    stand_in = tmp_path_factory.mktemp("browser") / "chromium"
    stand_in.write_text("#!/bin/sh\nexit 1\n")
    stand_in.chmod(0o755)
    settings.BOX_BROWSER_EXECUTABLE = str(stand_in)
