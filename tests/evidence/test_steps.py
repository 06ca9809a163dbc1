"""Every step records what it did, before the next step begins: over the API, in the report,
and as artifact files served under the task's own access rule."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.factories import flow, make_owner
from tests.http_server import Handler, serving

SECRET = "hunter2-very-secret-value"


def results(box: Any, task_id: str) -> list[dict[str, Any]]:
    return [e for e in box.events(task_id) if e["kind"] == "step_result"]


def download(client: APIClient, url: str) -> tuple[int, str]:
    response = client.get(url)
    body = b"".join(response.streaming_content) if response.streaming else response.content
    return response.status_code, body.decode()


def test_a_run_step_records_its_exit_code_output_tails_and_the_whole_output_as_files(box):
    script = f"for i in $(seq 1 500); do echo line-$i; done; echo oops >&2; echo {SECRET}"
    task = box.create(title="run", flow=flow({"run": script}, {"run": "echo second"}),
                      facts={"token": SECRET}, secretFacts=["token"])
    box.wait_state(task["id"], "done")
    first, second = results(box, task["id"])
    data = first["data"]
    assert (data["step"], data["of"], data["kind"], data["ok"], data["exitCode"]) == (1, 2, "run", True, 0)
    assert first["summary"].startswith("step 1/2 run: exit 0")
    assert data["durationMs"] >= 0 and data["startedAt"]
    assert data["stdout"].splitlines()[-2:] == ["line-500", "${token}"]
    assert "line-1\n" not in data["stdout"] and len(data["stdout"].splitlines()) <= 40
    assert data["stderr"] == "oops"
    assert SECRET not in str(first)
    files = {a["name"]: a for a in first["artifacts"]}
    stdout = files["step-1-run-1-stdout.txt"]
    assert stdout["type"] == "text/plain" and stdout["url"] == f"/api/tasks/{task['id']}/artifacts/step-1-run-1-stdout.txt"
    status, text = download(box.api, stdout["url"])
    assert status == 200 and text.splitlines()[0] == "line-1" and text.splitlines()[-1] == "${token}"
    assert len(text.encode()) == stdout["size"] and SECRET not in text
    assert second["data"]["step"] == 2 and second["data"]["stdout"] == "second"


def test_each_result_is_logged_before_the_next_step_starts_with_one_numbering(box):
    task = box.create(title="order", flow=flow({"run": "true"}, {"write": {"path": "a.txt", "content": "abc"}},
                                               {"delete": "a.txt"}))
    box.wait_state(task["id"], "done")
    events = [e for e in box.events(task["id"]) if e["kind"] in ("step", "step_result")]
    assert [(e["kind"], e["data"]["step"]) for e in events] == [
        ("step", 1), ("step_result", 1), ("step", 2), ("step_result", 2), ("step", 3), ("step_result", 3)]
    assert [e["summary"].split(" ")[1] for e in events] == ["1/3", "1/3", "2/3", "2/3", "3/3", "3/3"]
    report = box.api.get(f"/api/tasks/{task['id']}/report").json()
    assert [(s["step"], s["result"]["ok"]) for s in report["steps"]] == [(1, True), (2, True), (3, True)]


def test_write_and_delete_record_the_path_and_size(box):
    task = box.create(title="files", flow=flow({"write": {"path": "d/a.txt", "content": "hello"}},
                                               {"delete": "d/a.txt"}))
    box.wait_state(task["id"], "done")
    wrote, deleted = (r["data"] for r in results(box, task["id"]))
    assert (wrote["path"], wrote["bytes"], wrote["created"]) == ("d/a.txt", 5, True)
    assert (deleted["path"], deleted["bytes"], deleted["directory"]) == ("d/a.txt", 5, False)


def test_a_failed_run_step_records_its_exit_code_and_stderr_before_the_task_fails(box):
    task = box.create(title="fails", flow=flow({"run": "echo partial; echo broken >&2; exit 3"}, {"run": "true"}))
    view = box.wait_state(task["id"], "failed")
    assert "exit 3" in view["error"]
    (result,) = results(box, task["id"])
    assert result["data"]["ok"] is False and result["data"]["exitCode"] == 3
    assert result["data"]["stderr"] == "broken" and result["data"]["stdout"] == "partial"
    assert result["data"]["error"].startswith("exit 3")
    report = box.api.get(f"/api/tasks/{task['id']}/report").json()
    assert report["steps"][0]["result"]["exitCode"] == 3 and report["steps"][0]["outcome"] == "failed"


class _Echo(Handler):
    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply(201, ("x" * 5000).encode())


@pytest.fixture
def server() -> Iterator[int]:
    with serving(_Echo) as port:
        yield port


def test_an_http_step_records_method_url_status_and_a_bounded_body(box, server):
    url = f"http://127.0.0.1:{server}/items"
    task = box.create(title="http", hosts=["127.0.0.1"], flow=flow({"http": {"url": url, "method": "post", "body": {"a": 1}}}))
    box.wait_state(task["id"], "done")
    (result,) = results(box, task["id"])
    data = result["data"]
    assert (data["method"], data["url"], data["status"], data["bytes"]) == ("POST", url, 201, 5000)
    assert data["body"].startswith("x" * 100) and len(data["body"]) < 2100 and "more characters" in data["body"]


def test_a_tool_step_records_its_arguments_and_result(box):
    task = box.create(title="tool", tools=["notify.owner"], flow=flow({"tool": "notify.owner", "args": {"message": "hi"}}))
    box.wait_state(task["id"], "done")
    (result,) = results(box, task["id"])
    assert result["data"]["tool"] == "notify.owner" and result["data"]["args"] == {"message": "hi"}
    assert result["data"]["result"]["delivered"] is False  # no notification URL is set here
    assert result["data"]["result"]["to"] == []


def test_a_command_worker_records_the_lines_it_reported_and_its_exit(box):
    script = "echo found one; echo found two; echo trouble >&2; exit 4"
    task = box.create(title="cmd", worker="command", prompt="p", command=["/bin/sh", "-c", script])
    box.wait_state(task["id"], "failed")
    events = box.events(task["id"])
    assert [e["summary"] for e in events if e["kind"] == "output"] == ["found one", "found two"]
    (result,) = [e for e in events if e["kind"] == "step_result"]
    data = result["data"]
    assert (data["kind"], data["exitCode"], data["linesReported"], data["stderr"]) == ("command", 4, 2, "trouble")
    assert {a["name"] for a in result["artifacts"]} == {"worker-run-1-stdout.txt", "worker-run-1-stderr.txt"}
    report = box.api.get(f"/api/tasks/{task['id']}/report").json()
    assert report["steps"][0]["result"]["exitCode"] == 4


def test_artifacts_are_served_only_under_the_tasks_access_rule(box):
    task = box.create(title="art", flow=flow({"run": "echo private output"}))
    box.wait_state(task["id"], "done")
    (result,) = results(box, task["id"])
    url = result["artifacts"][0]["url"]
    assert download(box.api, url) == (200, "private output\n")
    anonymous = APIClient()
    response = anonymous.get(url)
    assert response.status_code == 401 and response.json()["code"] == "UNAUTHENTICATED"
    other = APIClient()
    other.force_login(make_owner())
    response = other.get(url)
    assert response.status_code == 404 and response.json()["code"] == "NOT_FOUND"
    for bad in ("nope.txt", "..%2F..%2Fvault.key", ".spool", "%2Fetc%2Fpasswd"):
        response = box.api.get(f"/api/tasks/{task['id']}/artifacts/{bad}")
        assert response.status_code == 404 and response.json()["code"] == "NOT_FOUND", bad
    served = box.api.get(url)
    assert served["X-Content-Type-Options"] == "nosniff" and served["Content-Type"].startswith("text/plain")


def test_a_step_summary_shows_values_not_names_and_secrets_stay_masked(box):
    task = box.create(title="names", flow=flow({"run": "echo ${who} ${token}"}, who="Ada"),
                      facts={"token": SECRET}, secretFacts=["token"])
    box.wait_state(task["id"], "done")
    (start,) = [e for e in box.events(task["id"]) if e["kind"] == "step"]
    assert start["summary"] == "step 1/1 run: echo Ada ${token}"
