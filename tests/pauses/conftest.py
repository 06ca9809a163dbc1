"""Fixtures for the pause tests."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from approvals.blockers import stage_question
from approvals.models import QuestionKind
from boxsite.core.errors import BoxError, Conflict
from tasks import services
from tasks.models import Task
from tasks.run import lifecycle
from tasks.states import ACTIVE, State
from tasks.tools.registry import Tool, register
from tests.conftest import wait_for

SEEN_DURING_RUN: list[Any] = []


@pytest.fixture(autouse=True)
def _release_what_tests_leave_waiting(request: pytest.FixtureRequest) -> Any:
    """A task a test leaves waiting still holds its user and mounts (only an ending releases
    them); cancel every unfinished task after the test, before its database goes away."""
    if "box" not in request.fixturenames:
        yield
        return
    if "driver" in request.fixturenames:
        # A layer test's data directory (tests/layers/conftest.py) is removed at its driver's
        # teardown: set up before the box, so the box's releases still find the task users there.
        request.getfixturevalue("driver")
    request.getfixturevalue("box")  # set up first, so it is torn down after this cleanup
    yield

    for task_id in Task.objects.filter(state__in=ACTIVE).values_list("pk", flat=True):
        for _ in range(5):  # a worker may move it meanwhile; try again from where it is
            task = Task.objects.get(pk=task_id)
            if task.is_final():
                break
            try:
                services.transition(task, State.CANCELLED, summary="cancelled: the test ended")
                break
            except Conflict:
                continue
            except BoxError:
                break  # cancelled, but its release failed (a busy /etc/passwd): released again below

        def released() -> bool:
            try:
                lifecycle.release(task_id)  # idempotent
            except BoxError:
                return False
            return True

        wait_for(released, timeout=20, interval=0.2, what=f"the release of {task_id}")


@pytest.fixture
def staging_tool(box):
    """A tool standing in for the broker's `box ask`: it stages a question during the run."""

    def ask(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        with transaction.atomic():
            stage_question(ctx.task, ctx.run, QuestionKind.TEXT, args["prompt"])
        SEEN_DURING_RUN.append(box.api.get("/api/inbox").json())
        return {"staged": True}

    register(Tool(name="test.ask", description="stage a question", schema={"type": "object"}, impl=ask))
    SEEN_DURING_RUN.clear()
    return "test.ask"
