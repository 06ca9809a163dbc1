"""The new browser step kinds are checked when the task is created (a mistake is a 400 naming
the field) and the planner's guide describes every kind the flow language has."""
from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tasks.models import Task
from tasks.spec.flows import STEP_KINDS, validate_flow
from tests.factories import flow


@pytest.mark.parametrize("step, field", [
    ({"press": ""}, "flow.steps[0].press"),
    ({"press": "Entr"}, "flow.steps[0].press"),
    ({"press": {"label": "Search", "keys": ["Enter", 3]}}, "flow.steps[0].press.keys"),
    ({"press": {"label": "Search"}}, "flow.steps[0].press.keys"),
    ({"press": {"keys": "Enter", "delay": 5}}, "flow.steps[0].press.delay"),
    ({"select": {"label": "Size"}}, "flow.steps[0].select.option"),
    ({"select": {"option": "Large"}}, "flow.steps[0].select"),
    ({"select": {"label": "Size", "option": []}}, "flow.steps[0].select.option"),
    ({"select": "#size"}, "flow.steps[0]"),
    ({"upload": {"label": "CV", "file": "../secrets.txt"}}, "flow.steps[0].upload.file"),
    ({"upload": {"label": "CV", "file": "docs/../../x"}}, "flow.steps[0].upload.file"),
    ({"upload": {"label": "CV", "file": "/etc/passwd"}}, "flow.steps[0].upload.file"),
    ({"upload": {"label": "CV", "file": ["cv.txt", ""]}}, "flow.steps[0].upload.file"),
    ({"upload": {"file": "cv.txt"}}, "flow.steps[0].upload"),
    ({"wait": {"text": "Ready", "url": "/done"}}, "flow.steps[0].wait"),
    ({"wait": {}}, "flow.steps[0].wait"),
    ({"wait": {"network": "busy"}}, "flow.steps[0].wait.network"),
    ({"wait": {"text": "Ready", "state": "shiny"}}, "flow.steps[0].wait.state"),
    ({"wait": {"describe": "the results"}}, "flow.steps[0].wait.describe"),
    ({"tab": "second"}, "flow.steps[0].tab"),
    ({"tab": {"index": 0}}, "flow.steps[0].tab.index"),
    ({"tab": {"index": 1, "url": "x"}}, "flow.steps[0].tab"),
    ({"click": "#del", "dialog": "ok"}, "flow.steps[0].dialog"),
    ({"click": "#del", "dialog": {"accept": 3}}, "flow.steps[0].dialog"),
    ({"extract": "h1", "dialog": "accept"}, "flow.steps[0].dialog"),
    ({"click": {"text": "Go", "frame": ""}}, "flow.steps[0].click.frame"),
    ({"click": {"text": "Go", "frame": {"name": "pay"}}}, "flow.steps[0].click.frame"),
    ({"extract": {"describe": "the fares", "schema": {"type": "nonsense"}}}, "flow.steps[0].extract.schema"),
    ({"extract": {"selector": "h1", "schema": {"type": "object"}}}, "flow.steps[0].extract.schema"),
    ({"extract": {"describe": ""}}, "flow.steps[0].extract.describe"),
])
def test_a_bad_browser_step_is_an_invalid_flow_naming_the_field(box, step, field):
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow({"browse": "https://example.org"}, step)}, format="json")
    body = response.json()
    shifted = field.replace("steps[0]", "steps[1]")
    assert response.status_code == 400 and body["code"] == "INVALID_FLOW" and body["field"] == shifted, body
    assert not Task.objects.exists()


GOOD: list[dict[str, Any]] = [
    {"press": "Control+A"}, {"press": "+"}, {"press": {"keys": ["Shift+Tab", "Enter"], "role": "textbox", "name": "Search"}},
    {"select": {"label": "Size", "option": "Large"}}, {"select": {"selector": "#extras", "option": ["bag", "Meal"]}},
    {"upload": {"label": "CV", "file": "docs/cv.txt"}}, {"upload": {"selector": "#cv", "file": ["a.txt", "${name}.pdf"]}},
    {"wait": "network"}, {"wait": "load"}, {"wait": "#results"}, {"wait": {"text": "Ready"}, "timeout_s": 5}, {"wait": {"selector": ".spinner", "state": "hidden"}},
    {"wait": {"url": "/done"}}, {"wait": {"network": "idle"}}, {"wait": {"text": "Sent", "frame": "#signup"}},
    {"tab": "first"}, {"tab": "previous"}, {"tab": {"index": 2}}, {"tab": {"url": "/terms"}},
    {"click": "#del", "dialog": "accept"}, {"click": {"text": "Rename"}, "dialog": {"accept": "new name"}},
    {"fill": {"label": "Email", "frame": {"url": "/inner"}, "value": "a@b.c"}},
    {"extract": {"describe": "the fares", "schema": {"type": "array", "items": {"type": "object"}}}},
    {"extract": {"describe": "the page's heading"}},
]


def test_what_the_new_kinds_take_is_accepted_and_fits_the_guides_schema(box):
    response = box.api.get("/api/describe")
    assert response.status_code == 200
    step_schemas = {name: guide["schema"] for name, guide in response.json()["steps"].items()}
    for step in GOOD:
        validate_flow(flow({"browse": "https://example.org"}, step))
        kind = next(k for k in step if k in STEP_KINDS)
        jsonschema.validate(step, step_schemas[kind])


def test_the_guide_describes_every_step_kind_of_the_flow_language(box):
    guide = box.api.get("/api/describe").json()
    assert set(guide["steps"]) == set(STEP_KINDS)
    for name, kind in STEP_KINDS.items():
        described = guide["steps"][name]
        assert described["what"] and described["acts"] == kind.acts, name
        assert described["schema"]["required"] == [name]
    for example in guide["examples"]:
        validate_flow(example["flow"])
    rules = " ".join(guide["flowLanguage"])
    assert "frame" in rules and "dialog" in rules
