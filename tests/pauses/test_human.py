"""Needs a person: a failed step whose output shows a captcha, a login form or a one-time-code
prompt pauses for a human; continuing re-runs from that step. Other failures fail."""
from __future__ import annotations

import pytest

from tests.factories import flow
from tests.pauses.helpers import cont, open_questions, report

# The step shows the wall the first time only: by the next try a person has got past it.
WALL = "if [ -f tried ]; then echo through; else touch tried; echo '{text}'; exit 1; fi"
ALWAYS = "echo '{text}'; exit 1"


@pytest.mark.parametrize(("text", "label"), [
    ("Please verify you are a human: complete the CAPTCHA", "a captcha"),
    ("Login required. Please sign in to continue", "a login form"),
    ("Enter the one-time code we sent to your phone", "a one-time-code prompt"),
])
def test_a_step_failing_on_a_wall_pauses_for_a_person(box, text, label):
    spec = flow({"run": "echo start >> log.txt"}, {"run": WALL.format(text=text), "save": "wall"})
    task = box.create(title="wall", flow=spec)
    view = box.wait_state(task["id"], "waiting")
    assert view["waitingFor"] == "human"
    assert label in view["pause"]["message"]
    assert view["next"][0] == "continue"
    questions = open_questions(box, task["id"])
    assert [q["kind"] for q in questions] == ["human"]


def test_continuing_re_runs_from_the_step_that_hit_the_wall(box):
    spec = flow({"run": "echo start >> log.txt"}, {"run": WALL.format(text="captcha"), "save": "wall"},
                {"run": "cat log.txt", "save": "log"})
    task = box.create(title="wall", flow=spec)
    box.wait_state(task["id"], "waiting")
    response = cont(box, task["id"], answer="solved it")
    assert response.status_code == 200, response.json()
    box.wait_state(task["id"], "done")
    body = report(box, task["id"])
    assert body["records"]["wall"] == "through"
    assert body["records"]["log"] == "start"  # the first step did not run again
    assert [r["kind"] for r in body["runs"]] == ["start", "retry"]
    assert body["questions"][0]["state"] == "answered"
    assert body["questions"][0]["answer"] == {"inputs": {}, "answer": "solved it"}


def test_continuing_while_the_wall_is_still_there_pauses_again(box):
    task = box.create(title="wall", flow=flow({"run": ALWAYS.format(text="captcha")}))
    first = box.wait_state(task["id"], "waiting")
    assert cont(box, task["id"]).status_code == 200
    again = box.wait_state(task["id"], "waiting")
    assert again["waitingFor"] == "human" and again["version"] > first["version"]
    assert len(open_questions(box, task["id"])) == 1


def test_a_failure_without_such_signs_fails_the_task(box):
    task = box.create(title="plain failure", flow=flow({"run": "echo 'no such file: config.yml' >&2; exit 2"}))
    view = box.wait_state(task["id"], "failed")
    assert "exit 2: no such file: config.yml" in view["error"]
    assert view["recoverable"] is True and view["hint"]
    assert box.task(task["id"])["questions"] == []
