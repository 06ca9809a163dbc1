"""The command worker: exit 0 is done, any other exit fails with the last stderr line."""
from __future__ import annotations


def test_exit_zero_is_done_and_output_is_logged(box):
    task = box.create(title="ok", worker="command", prompt="say hi", command=["/bin/sh", "-c", 'echo "hello from $BOX_TASK_ID"'])
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view
    outputs = [e["summary"] for e in box.events(task["id"]) if e["kind"] == "output"]
    assert outputs == [f"hello from {task['id']}"]


def test_a_non_zero_exit_fails_with_the_last_stderr_line(box):
    task = box.create(title="bad", worker="command", prompt="p",
                      command=["/bin/sh", "-c", "echo first >&2; echo 'the real reason' >&2; exit 3"])
    view = box.wait_state(task["id"], "failed")
    assert view["error"] == "worker exited with 3: the real reason"


def test_a_missing_executable_fails_with_the_reason(box):
    task = box.create(title="missing", worker="command", prompt="p", command=["/nonexistent/agent", "--go"])
    view = box.wait_state(task["id"], "failed")
    assert view["error"].startswith("the worker could not start: /nonexistent/agent")
    assert "No such file" in view["error"]


def test_the_worker_runs_in_its_own_copy_of_the_workspace(box):
    (box.home / "input.txt").write_text("from the base")
    task = box.create(title="copy", worker="command", prompt="p",
                      command=["/bin/sh", "-c", "cat input.txt && echo changed > input.txt"])
    box.wait_state(task["id"], "done")
    outputs = [e["summary"] for e in box.events(task["id"]) if e["kind"] == "output"]
    assert outputs == ["from the base"]
    assert (box.home / "input.txt").read_text() == "from the base"


def test_a_relative_program_is_found_in_the_tasks_own_view(box):
    script = box.home / "agent.sh"
    script.write_text("#!/bin/sh\necho \"agent ran in $(basename \"$PWD\" >/dev/null; echo its view)\"\n")
    script.chmod(0o755)
    task = box.create(title="relative", worker="command", prompt="p", command=["./agent.sh"])
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert [e["summary"] for e in box.events(task["id"]) if e["kind"] == "output"] == ["agent ran in its view"]


def test_a_program_that_is_there_but_not_executable_is_called_so(box):
    (box.home / "agent.sh").write_text("#!/bin/sh\necho hi\n")
    (box.home / "agent.sh").chmod(0o644)
    task = box.create(title="not executable", worker="command", prompt="p", command="./agent.sh --go")
    view = box.wait_state(task["id"], "failed")
    assert view["error"] == "the worker could not start: ./agent.sh: not executable"
    assert "chmod +x" in view["hint"]
