"""Settings → Tasks that create work, in a real Chromium: off by default, turned on with its
bound, and a bad bound answered next to the field."""
from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from boxsite.models import BoxSettings
from tests.conftest import wait_for
from tests.e2e.conftest import create_owner

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_owner_turns_on_tasks_that_create_work_and_sets_its_bound(page: Any) -> None:
    create_owner(page)
    page.goto("/settings")
    allowed = page.get_by_label("A running task may create tasks and schedules")
    expect(allowed).not_to_be_checked()
    bound = page.get_by_label("Most tasks and schedules one task may create")
    allowed.check()
    bound.fill("101")
    page.get_by_role("button", name="Save defaults").click()
    expect(page.locator('[data-error-for="maxCreatedPerTask"]')).to_contain_text("between 1 and 100")
    assert BoxSettings.current().tasks_may_create_work is False  # nothing taken from a refused body

    bound.fill("3")
    page.get_by_role("button", name="Save defaults").click()
    saved = wait_for(lambda: (row := BoxSettings.current()).tasks_may_create_work and row, what="the policy saved")
    assert saved.max_created_per_task == 3
    page.reload()
    expect(page.get_by_label("A running task may create tasks and schedules")).to_be_checked()
    expect(page.get_by_label("Most tasks and schedules one task may create")).to_have_value("3")
