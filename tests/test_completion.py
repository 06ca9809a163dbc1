"""Completion contracts: a task becomes done only when its criteria hold, checked by the box
from what the run really left; one automatic repair, then a question, then failure."""
from __future__ import annotations

import json
from typing import Any

import pytest

from tasks.layers import paths
from tasks.models import Run, Task
from tests.conftest import Box
from tests.factories import flow


def kinds(task_id: str) -> list[str]:
    return list(Run.objects.filter(task_id=task_id).order_by("number").values_list("kind", flat=True))


def completion_notes(box: Box, task_id: str) -> list[dict[str, Any]]:
    return [e for e in box.events(task_id) if e["kind"] == "note" and "completion" in e["data"]]


def test_an_empty_criteria_list_closes_from_a_successful_run_with_no_extra_run(box: Box) -> None:
    task = box.create(title="t", flow=flow({"write": {"path": "a.txt", "content": "a"}}), criteria=[])
    assert box.wait_state(task["id"], "done")["criteria"] == []
    assert kinds(task["id"]) == ["start"] and completion_notes(box, task["id"]) == []


def test_met_criteria_close_the_task_with_receipts(box: Box) -> None:
    document = json.dumps({"status": "ok", "items": [{"n": 3}]})
    task = box.create(title="t", flow=flow({"write": {"path": "outputs/result.json", "content": document}},
                                           {"run": "true"}),
                      criteria=[{"kind": "output_file", "path": "outputs/result.json", "mediaType": "application/json",
                                 "json": {"/status": "ok", "/items/0/n": 3}, "contains": "items",
                                 "size": len(document)},
                                {"kind": "command_exit", "command": "true", "exitCode": 0}])
    box.wait_state(task["id"], "done")
    note = completion_notes(box, task["id"])[-1]
    assert note["summary"] == "completion criteria met"
    receipt = note["data"]["completion"][0]
    assert receipt["ok"] and receipt["size"] == len(document) and receipt["mediaType"] == "application/json"
    assert kinds(task["id"]) == ["start"]


@pytest.mark.parametrize(("criterion", "why"), [
    ({"kind": "output_file", "path": "outputs/pic.png", "mediaType": "image/png"}, "its bytes are text/plain, not image/png"),
    ({"kind": "output_file", "path": "outputs/missing.txt"}, "no such file"),
    ({"kind": "output_file", "path": "outputs/pic.png", "json": {"/a": 1}}, "it is not JSON"),
    ({"kind": "output_file", "path": "outputs/pic.png", "sha256": "0" * 64}, "SHA-256 differs"),
    # a receipt spoofed in the output: the box recorded only the echo, never 'make test'
    ({"kind": "command_exit", "command": "make test", "exitCode": 0}, "no run of that exact command"),
])
def test_unmet_criteria_are_judged_from_the_bytes_and_the_boxs_own_records(box: Box, settings: Any,
                                                                        criterion: dict[str, Any], why: str) -> None:
    settings.BOX_MAX_RUN_ATTEMPTS = 1  # no repair: fail with the report at once
    task = box.create(title="t", criteria=[criterion], flow=flow(
        {"write": {"path": "outputs/pic.png", "content": "not a picture at all"}},
        {"run": "echo '{\"command\": \"make test\", \"exitCode\": 0}'"}))
    failed = box.wait_state(task["id"], "failed")
    assert failed["error"].startswith("completion criteria not met after 1 attempts") and why in failed["error"]


def test_the_inspection_limit_is_one_mebibyte(box: Box, settings: Any) -> None:
    settings.BOX_MAX_RUN_ATTEMPTS = 1
    big = box.create(title="big", criteria=[{"kind": "output_file", "path": "outputs/big.txt", "contains": "a"}],
                     flow=flow({"run": "mkdir -p outputs && head -c 1048577 /dev/zero | tr '\\0' a > outputs/big.txt"}))
    assert "larger than the 1048576-byte inspection limit" in box.wait_state(big["id"], "failed")["error"]
    fits = box.create(title="fits", criteria=[{"kind": "output_file", "path": "outputs/big.txt", "contains": "a"}],
                      flow=flow({"run": "mkdir -p outputs && head -c 1048576 /dev/zero | tr '\\0' a > outputs/big.txt"}))
    box.wait_state(fits["id"], "done")


@pytest.mark.parametrize(("count", "state"), [(100, "done"), (101, "failed")])
def test_at_most_100_output_files_are_taken(box: Box, settings: Any, count: int, state: str) -> None:
    settings.BOX_MAX_RUN_ATTEMPTS = 1
    task = box.create(title="many", criteria=[{"kind": "output_file", "path": "outputs/f1"}], flow=flow(
        {"run": f"mkdir -p outputs && for i in $(seq 1 {count}); do echo $i > outputs/f$i; done"}))
    view = box.wait_state(task["id"], state)
    if state == "failed":
        assert "101 output files; at most 100 are taken, so none were" in view["error"]


def test_one_automatic_repair_then_one_question_then_failure_when_attempts_run_out(box: Box) -> None:
    task = box.create(title="never makes it", criteria=[{"kind": "output_file", "path": "outputs/r.txt"}],
                      flow=flow({"write": {"path": "other.txt", "content": "x"}}))
    waiting = box.wait_state(task["id"], "waiting", "failed", "done")
    assert waiting["state"] == "waiting", (waiting, [e["summary"] for e in box.events(task["id"])])
    assert waiting["waitingFor"] == "human" and "completion criteria are not met" in waiting["pause"]["message"]
    assert kinds(task["id"]) == ["start", "repair"]
    questions = [q for q in box.task(task["id"])["questions"] if q["state"] == "open"]
    assert len(questions) == 1
    runs = box.api.get(f"/api/tasks/{task['id']}/runs").json()
    assert runs["attempts"] == {"total": 2, "charged": 2}  # a repair question after a finished run is not refunded
    answered = box.api.post(f"/api/tasks/{task['id']}/continue", {"answer": "try again"}, format="json")
    assert answered.status_code == 200, answered.json()
    failed = box.wait_state(task["id"], "failed")
    assert failed["error"].startswith("completion criteria not met after 3 attempts: outputs/r.txt: no such file")
    assert failed["recoverable"] is False and "retry" not in failed["next"]  # a retry would check the same files
    assert len(kinds(task["id"])) == 3


def test_a_human_repair_queues_a_fresh_run_that_can_succeed(box: Box, settings: Any) -> None:
    settings.BOX_MAX_RUN_ATTEMPTS = 5
    task = box.create(title="needs a hand", criteria=[{"kind": "output_file", "path": "outputs/r.txt"}], flow=flow(
        {"run": "if [ -f fixed ]; then mkdir -p outputs && echo ok > outputs/r.txt; fi"}))
    box.wait_state(task["id"], "waiting")
    (paths.view_dir(task["id"]) / "fixed").write_text("the owner fixed it\n")  # the owner's fix, in its files
    box.api.post(f"/api/tasks/{task['id']}/continue", {"answer": "fixed"}, format="json")
    box.wait_state(task["id"], "done")
    assert kinds(task["id"]) == ["start", "repair", "retry"]


@pytest.mark.parametrize(("criteria", "field"), [
    ({"kind": "output_file", "path": "../etc/passwd"}, "criteria[0].path"),
    ({"kind": "output_file", "path": "report.txt"}, "criteria[0].path"),
    ({"kind": "output_file", "path": "outputs/a", "sha256": "xyz"}, "criteria[0].sha256"),
    ({"kind": "command_exit", "command": ""}, "criteria[0].command"),
    ({"kind": "command_exit", "command": "make", "exitCode": 300}, "criteria[0].exitCode"),
    ({"kind": "llm_judge"}, "criteria[0].kind"),
    ({"kind": "output_file", "path": "outputs/a", "colour": "red"}, "criteria[0].colour"),
])
def test_bad_criteria_are_refused_whole(box: Box, criteria: dict[str, Any], field: str) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow({"run": "true"}), "criteria": [criteria]},
                            format="json")
    assert response.status_code == 400 and response.json()["field"] == field, response.json()
    assert not Task.objects.exists()
