"""The rescuer: a step that fails recoverably is shown (redacted) to the model, which retries it
(optionally amended), skips it, or gives up; each rescue is logged, reported and counted."""
from __future__ import annotations

import json
from typing import Any

from tests.fakemodel import FakeModel, say, secret_forms
from tests.pauses.helpers import report


def decide(decision: str, reason: str = "because", step: dict[str, Any] | None = None) -> Any:
    body: dict[str, Any] = {"decision": decision, "reason": reason}
    if step is not None:
        body["step"] = step
    return say(json.dumps(body))


FAILING = {"steps": [{"run": "cat missing.txt", "save": "text"}, {"write": {"path": "after.txt", "content": "went on"}}]}


def test_the_rescuer_retries_with_an_amended_step(box: Any, model: FakeModel) -> None:
    model.answer(decide("retry", "the file is called present.txt", {"run": "cat present.txt", "save": "text"}))
    (box.home / "present.txt").write_text("found it")
    task = box.create(title="r", flow=FAILING, budgetCents=100, facts={"password": "pw-secret-value-99"})
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    got = report(box, task["id"])
    assert got["records"]["text"] == "found it"
    [rescue] = got["rescues"]
    assert rescue["data"]["rescue"]["decision"] == "retry" and rescue["data"]["rescue"]["amended"]["run"] == "cat present.txt"
    assert done["spent"]["rescues"] == 1
    sent = model.received[0].messages[1]["content"]
    assert "cat missing.txt" in sent and "No such file" in sent
    for form in secret_forms("pw-secret-value-99"):
        assert form not in model.everything_sent()


def test_the_rescuer_skips_a_step_the_task_can_do_without(box: Any, model: FakeModel) -> None:
    model.answer(decide("skip", "optional"))
    task = box.create(title="s", flow=FAILING, budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    files = box.api.get("/api/workspaces/home/files", {"path": "after.txt"})
    assert "went on" in files.content.decode()
    assert report(box, task["id"])["rescues"][0]["data"]["rescue"]["decision"] == "skip"


def test_the_rescuer_gives_up_and_the_task_fails_with_its_reason(box: Any, model: FakeModel) -> None:
    model.answer(decide("give_up", "the file will never exist"))
    task = box.create(title="g", flow=FAILING, budgetCents=100)
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["recoverable"] is True and "the rescuer gave up: the file will never exist" in failed["error"]


def test_rescues_stop_at_max_rescues(box: Any, model: FakeModel) -> None:
    model.fallback = decide("retry", "try again")
    task = box.create(title="m", flow=FAILING, budgetCents=100, limits={"max_rescues": 2})
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["state"] == "failed" and failed["error"].startswith("step 1 (run) failed")
    assert len(model.received) == 2 and failed["spent"]["rescues"] == 2
    assert len(report(box, task["id"])["rescues"]) == 2


def test_a_wall_for_a_person_is_never_rescued(box: Any, model: FakeModel) -> None:
    task = box.create(title="w", flow={"steps": [{"run": "echo 'please solve the captcha' >&2; exit 1"}]}, budgetCents=100)
    assert box.wait_state(task["id"], "waiting", "failed")["waitingFor"] == "human"
    assert model.received == []


def test_max_rescues_above_five_is_refused(box: Any) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "flow": FAILING, "limits": {"max_rescues": 6}}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "limits.max_rescues"
