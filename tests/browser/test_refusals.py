"""What the box refuses about browsers, clearly and before anything is made."""
from __future__ import annotations

import pytest

from tasks.models import Task
from tests.factories import flow


def test_browser_steps_are_refused_when_the_box_has_no_browser(box, settings):
    settings.BOX_BROWSER_EXECUTABLE = "/nonexistent/chromium"
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow({"browse": "https://example.org"})}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "NOT_AVAILABLE" and "/nonexistent/chromium" in response.json()["message"]
    assert not Task.objects.exists()


@pytest.mark.parametrize("name, value", [("headed", True), ("browser_profile", "/srv/profile"),
                                         ("browser_executable", "/opt/chrome"), ("browser_endpoint", "http://127.0.0.1:9222")])
def test_browser_constraints_that_cannot_work_here_say_why(box, name, value):
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow({"browse": "https://example.org"}),
                                           "constraints": {name: value}}, format="json")
    body = response.json()
    assert response.status_code == 400 and body["code"] == "NOT_AVAILABLE" and body["field"] == f"constraints.{name}"
    assert not Task.objects.exists()


@pytest.mark.parametrize("step, field", [
    ({"click": {"value": "x"}}, "flow.steps[0].click"),
    ({"fill": {"selector": "#a"}}, "flow.steps[0].fill.value"),
    ({"browse": {"href": "x"}}, "flow.steps[0].browse.url"),
])
def test_a_browser_step_without_its_target_is_an_invalid_flow(box, step, field):
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow(step)}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "INVALID_FLOW" and response.json()["field"] == field


def test_a_flows_memory_must_be_hints(box):
    bad = flow({"browse": "https://example.org"})
    bad["memory"] = [{"instruction": "x"}]
    response = box.api.post("/api/tasks", {"title": "t", "flow": bad}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "flow.memory"
