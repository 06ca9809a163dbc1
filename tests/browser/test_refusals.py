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


@pytest.mark.parametrize("name, value", [("headed", True),
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


@pytest.mark.parametrize("name, value, why", [
    ("headed", True, "no display"),
    ("browser_executable", "/bin/sh", "box's own Chromium"), ("browser_endpoint", "http://127.0.0.1:9222", "bypass")])
def test_each_refusal_says_why(box, name, value, why):
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow({"browse": "https://example.org"}),
                                           "constraints": {name: value}}, format="json")
    assert response.status_code == 400 and why in response.json()["message"]


@pytest.mark.parametrize("constraints", [{"headed": False}, {"browser_executable": "the box's own"}])
def test_what_the_box_does_anyway_is_accepted(box, settings, constraints):
    if "browser_executable" in constraints:
        constraints = {"browser_executable": settings.BOX_BROWSER_EXECUTABLE}
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow({"browse": "https://example.org"}),
                                           "constraints": constraints}, format="json")
    assert response.status_code == 201, response.json()
    assert Task.objects.get(pk=response.json()["id"]).constraints == constraints


def test_a_relative_browser_executable_is_an_invalid_spec(box):
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow({"browse": "https://example.org"}),
                                           "constraints": {"browser_executable": "chromium"}}, format="json")
    body = response.json()
    assert (response.status_code, body["code"], body["field"]) == (400, "INVALID_SPEC", "constraints.browser_executable")


def test_spec_memory_and_trace_join_the_flow(box):
    hints = [{"instruction": "the Select button", "page": "http://127.0.0.1/shop", "selector": "#offers button"}]
    own = flow({"browse": "https://example.org"})
    own["memory"] = [{"instruction": "mine", "selector": "#a"}]
    response = box.api.post("/api/tasks", {"title": "t", "flow": own, "memory": hints, "trace": True}, format="json")
    assert response.status_code == 201, response.json()
    stored = Task.objects.get(pk=response.json()["id"]).flow
    assert stored["memory"] == [{"instruction": "mine", "selector": "#a"}, *hints] and stored["trace"] is True


@pytest.mark.parametrize("body, code, field", [
    ({"memory": [{"instruction": "x"}]}, "INVALID_SPEC", "memory"),
    ({"trace": "yes"}, "INVALID_SPEC", "trace"),
    ({"prompt": "book a flight", "flow": None, "trace": True}, "NOT_AVAILABLE", "trace"),
])
def test_spec_memory_and_trace_refused_in_the_error_shape(box, body, code, field):
    spec = {"title": "t", "flow": flow({"browse": "https://example.org"}), **body}
    if spec["flow"] is None:
        del spec["flow"]
    response = box.api.post("/api/tasks", spec, format="json")
    assert (response.status_code, response.json()["code"], response.json()["field"]) == (400, code, field)
    assert not Task.objects.exists()
