"""Settings → Remembered page elements, in a real Chromium: the owner sees what the grounding
cache keeps and clears it (after confirming)."""
from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from tasks.browser.cache import remember
from tasks.models import GroundingEntry, Task, Workspace
from tests.e2e.conftest import create_owner

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_owner_sees_the_remembered_elements_and_clears_them(page: Any) -> None:
    create_owner(page)
    task = Task.objects.create(owner=get_user_model().objects.get(), title="t", worker="flow",
                               workspace=Workspace.objects.get(name="home"))
    for flight in ("Play", "Sky"):
        remember(task, "http://shop.example/flights", f"the {flight} flight's Select button", kind="click",
                 selector='role=button[name="Select" s]', fingerprint={"role": "button", "name": "Select"})
    page.goto("/settings")
    remembered = page.get_by_role("list", name="Remembered page elements")
    expect(remembered.get_by_role("listitem")).to_have_count(2)
    expect(remembered).to_contain_text("the Play flight's Select button")
    expect(remembered).to_contain_text("http://shop.example/flights")

    page.get_by_role("button", name="Clear remembered elements").click()
    page.get_by_role("dialog").get_by_role("button", name="Clear remembered elements").click()  # it asks first
    expect(remembered).to_contain_text("Nothing is remembered.")
    assert not GroundingEntry.objects.exists()
