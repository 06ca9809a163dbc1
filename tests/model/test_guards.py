"""Guards hold whatever the model says: an amended step keeps the guard of the step it replaces,
a planned step that deletes or sends waits for the owner though the plan left out stop_before,
the agent's requests that change something ask first; and a planned task ends with its answer."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakemodel import FakeModel, call, say
from tests.http_server import Handler, serving
from tests.pauses.helpers import pending_approval, post, report


@pytest.fixture
def sink() -> Iterator[tuple[str, list[str]]]:
    """A local server (its URL) and the paths of the POSTs it received; a GET answers an empty list."""
    got: list[str] = []

    class Sink(Handler):
        def do_POST(self) -> None:
            got.append(self.path)
            self.reply(200, b'{"ok": true}')

        def do_GET(self) -> None:
            self.reply(200, b'{"items": []}')

    with serving(Sink) as port:
        yield f"http://127.0.0.1:{port}", got


def read(box: Any, path: str) -> str:
    response = box.api.get("/api/workspaces/home/files", {"path": path})
    return str(response.json()["content"]) if response.status_code == 200 else ""


def commands_run(box: Any, task_id: str) -> list[str]:
    events = box.events(task_id)
    run = {e["data"]["call"] for e in events if e["kind"] == "tool_result" and e["data"].get("tool") == "run_command"}
    return [e["data"]["args"]["command"] for e in events if e["kind"] == "tool_call" and e["data"].get("call") in run]


def step_results(box: Any, task_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in box.events(task_id) if e["kind"] == "step_result"]


def test_a_rescued_guarded_step_does_not_run_amended_without_a_new_approval(box: Any, model: FakeModel) -> None:
    amended = {"run": "echo amended > amended.txt"}
    model.answer(say(json.dumps({"decision": "retry", "reason": "try another way", "step": amended})))
    task = box.create(title="g", budgetCents=100,
                      flow={"steps": [{"run": "cat missing.txt", "stop_before": "it touches the owner's files"}]})
    assert box.wait_state(task["id"], "waiting")["waitingFor"] == "approval"
    assert post(box, f"/api/approvals/{pending_approval(box, task['id'])['id']}/approve").status_code == 200
    waiting = box.wait_state(task["id"], "waiting", "done", "failed")
    assert waiting["state"] == "waiting" and waiting["waitingFor"] == "approval", waiting
    again = pending_approval(box, task["id"])
    assert again["detail"]["command"] == "echo amended > amended.txt"
    assert [r.get("command") for r in step_results(box, task["id"])] == ["cat missing.txt"]  # the amended one did not run
    assert post(box, f"/api/approvals/{again['id']}/approve").status_code == 200
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", (done["error"], step_results(box, task["id"]))
    assert step_results(box, task["id"])[-1]["command"] == "echo amended > amended.txt"


def test_a_planned_rm_waits_for_approval_though_the_model_left_out_stop_before(box: Any, model: FakeModel) -> None:
    (box.home / "build").mkdir()
    (box.home / "build" / "out.o").write_text("x")
    model.answer(say(json.dumps({"steps": [{"run": "rm -rf build"}]})))
    task = box.create(title="clean", prompt="remove the build folder", worker="flow", budgetCents=100)
    waiting = box.wait_state(task["id"], "waiting", "done", "failed")
    assert waiting["waitingFor"] == "approval", waiting
    assert "stop_before" in waiting["flow"]["steps"][0]
    assert pending_approval(box, task["id"])["detail"]["command"] == "rm -rf build"
    assert step_results(box, task["id"]) == []


def test_a_planned_http_post_waits_for_approval_though_the_model_left_out_stop_before(box: Any, model: FakeModel,
                                                                                      sink: tuple[str, list[str]]) -> None:
    url, got = sink
    model.answer(say(json.dumps({"steps": [{"http": {"method": "POST", "url": f"{url}/orders", "body": {"item": "tea"}}}]})))
    task = box.create(title="order", prompt="order tea", worker="flow", hosts=["127.0.0.1"], budgetCents=100)
    waiting = box.wait_state(task["id"], "waiting", "done", "failed")
    assert waiting["waitingFor"] == "approval", waiting
    assert pending_approval(box, task["id"])["detail"]["method"] == "POST"
    assert got == []


def test_the_agents_post_asks_first_then_is_sent_once(box: Any, model: FakeModel, sink: tuple[str, list[str]]) -> None:
    url, got = sink
    model.answer(call("http_request", url=f"{url}/items"), call("http_request", method="POST", url=f"{url}/items", body={"a": 1}),
                 call("finish", answer="posted"))
    task = box.create(title="post", prompt="add an item", hosts=["127.0.0.1"], budgetCents=100)
    waiting = box.wait_state(task["id"], "waiting", "done", "failed")
    assert waiting["waitingFor"] == "approval", waiting
    approval = pending_approval(box, task["id"])
    assert approval["kind"] == "irreversible" and "POST" in approval["summary"]
    assert got == []  # the GET went without asking; the POST waits
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert got == ["/items"]


def test_the_agents_post_goes_without_asking_when_the_task_allows_destructive_steps(box: Any, model: FakeModel,
                                                                                   sink: tuple[str, list[str]]) -> None:
    url, got = sink
    model.answer(call("http_request", method="POST", url=f"{url}/x"), call("finish", answer="ok"))
    task = box.create(title="post", prompt="post it", hosts=["127.0.0.1"], budgetCents=100,
                      constraints={"allow_destructive": True})
    assert box.wait_state(task["id"], "done", "failed", "waiting")["state"] == "done"
    assert got == ["/x"]


def test_a_planned_task_ends_with_its_answer_shown(box: Any, model: FakeModel) -> None:
    model.answer(say(json.dumps({"steps": [{"run": "echo 'the answer is 42'"}]})))
    task = box.create(title="q", prompt="what is the answer", worker="flow", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert report(box, task["id"])["records"]["answer"] == "the answer is 42"
    assert done["answer"] == "the answer is 42"
    assert any(e["kind"] == "output" and e["data"].get("answer") == "the answer is 42" for e in box.events(task["id"]))


def test_the_agents_curl_post_to_a_listed_host_asks_first_then_runs_once(box: Any, model: FakeModel,
                                                                           sink: tuple[str, list[str]]) -> None:
    url, _ = sink
    model.answer(call("run_command", command=f"curl -s {url}/items > got.json; echo read >> ran.txt"),
                 call("run_command", command=f"curl -s -X POST -d a=1 {url}/items; echo sent >> ran.txt"),
                 call("finish", answer="posted"))
    task = box.create(title="curl", prompt="add an item with curl", hosts=["127.0.0.1"], budgetCents=100)
    waiting = box.wait_state(task["id"], "waiting", "done", "failed")
    assert waiting["waitingFor"] == "approval", waiting
    approval = pending_approval(box, task["id"])
    assert approval["kind"] == "irreversible" and "curl -s -X POST" in approval["summary"]
    assert commands_run(box, task["id"]) == [f"curl -s {url}/items > got.json; echo read >> ran.txt"]  # the GET went unasked
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert read(box, "ran.txt") == "read\nsent\n"  # the POST ran once, on the OK


def test_the_agents_curl_post_goes_without_asking_when_allowed_or_when_no_host_is_listed(box: Any, model: FakeModel) -> None:
    for constraints, hosts in (({"allow_destructive": True}, ["127.0.0.1"]), ({}, [])):
        model.answer(call("run_command", command="curl -s -X POST http://127.0.0.1:9/x; echo tried > ran.txt"),
                     call("finish", answer="ok"))
        task = box.create(title="curl", prompt="post it", hosts=hosts, budgetCents=100, constraints=constraints)
        assert box.wait_state(task["id"], "done", "failed", "waiting")["state"] == "done"
        assert read(box, "ran.txt") == "tried\n"
