"""An approval shows what it approves: the exact command, the file and its diff, the next step
an approve gate lets go ahead, the tool and its arguments; redacted."""
from __future__ import annotations

from tasks.tools.registry import Tool, register
from tests.factories import flow
from tests.pauses.helpers import pending_approval

SECRET = "s3cr3t-password-value"


def paused(box, spec, **extra):
    task = box.create(title="asks", flow=spec, **extra)
    return box.wait_state(task["id"], "waiting")


def test_a_guarded_run_step_shows_the_exact_command_with_secrets_masked(box):
    view = paused(box, flow({"run": "deploy --token ${token} --to prod", "stop_before": "deploying is for real"}),
                  facts={"token": SECRET}, secretFacts=["token"])
    approval = pending_approval(box, view["id"])
    assert approval["detail"]["action"] == "run"
    assert approval["detail"]["command"] == "deploy --token ${token} --to prod"
    assert SECRET not in str(box.api.get("/api/inbox").json())


def test_a_guarded_write_shows_the_file_its_content_and_the_diff_against_what_is_there(box):
    (box.home / "notes.txt").write_text("one\ntwo\n")
    view = paused(box, flow({"write": {"path": "notes.txt", "content": "one\nthree\n"}, "stop_before": "rewrite notes"},
                            {"write": {"path": "new.txt", "content": "fresh"}, "stop_before": "new file"}))
    detail = pending_approval(box, view["id"])["detail"]
    assert (detail["action"], detail["path"], detail["bytes"]) == ("write", "notes.txt", 10)
    assert "-two\n" in detail["diff"] and "+three\n" in detail["diff"]


def test_an_approve_gate_shows_the_step_it_lets_go_ahead(box):
    view = paused(box, flow({"approve": "ok to send?"}, {"http": {"url": "https://example.org/send", "method": "post"}}),
                  hosts=["example.org"])
    detail = pending_approval(box, view["id"])["detail"]
    assert (detail["then"], detail["action"], detail["method"], detail["url"]) == (2, "http", "POST", "https://example.org/send")


def test_an_irreversible_tool_step_shows_the_tool_and_its_arguments(box):
    register(Tool(name="test.fire", description="acts for real", schema={"type": "object"},
                  impl=lambda ctx, args: {"fired": True}, irreversible=True))
    view = paused(box, flow({"tool": "test.fire", "args": {"target": "${where}"}}, where="moon"), tools=["test.fire"])
    detail = pending_approval(box, view["id"])["detail"]
    assert detail["tool"] == "test.fire" and detail["args"] == {"target": "moon"}
