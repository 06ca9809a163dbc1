"""Fixtures for the pause tests."""
from __future__ import annotations

from typing import Any

import pytest

SEEN_DURING_RUN: list[Any] = []


@pytest.fixture
def staging_tool(box):
    """A tool standing in for the broker's `box ask`: it stages a question during the run."""
    from approvals.services import stage_question
    from tasks.tools import Tool, register

    def ask(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        from django.db import transaction

        with transaction.atomic():
            stage_question(ctx.task, ctx.run, "text", args["prompt"])
        SEEN_DURING_RUN.append(box.api.get("/api/inbox").json())
        return {"staged": True}

    register(Tool(name="test.ask", description="stage a question", schema={"type": "object"}, impl=ask))
    SEEN_DURING_RUN.clear()
    return "test.ask"
