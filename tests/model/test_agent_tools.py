"""The tools a coding agent needs: edit by exact string, read by line range, search, glob; a
timeout on every command; the environment's rules and the workspace's AGENTS.md in the prompt."""
from __future__ import annotations

import json
from typing import Any

from tests.fakemodel import FakeModel, call, secret_forms


def content(box: Any, path: str) -> str:
    return str(box.api.get("/api/workspaces/home/files", {"path": path}).json()["content"])


def result(model: FakeModel, n: int) -> dict[str, Any]:
    """What the model was shown as the result of its n-th turn's call."""
    message = model.received[n].messages[-1]
    assert message["role"] == "tool", message
    return dict(json.loads(message["content"]))


def test_edit_file_replaces_an_exact_string_and_says_when_it_is_absent_or_ambiguous(box: Any, model: FakeModel) -> None:
    (box.home / "app.py").write_text("a = 1\nb = 1\n")
    model.answer(call("edit_file", path="app.py", old_string="= 1", new_string="= 2"),
                 call("edit_file", path="app.py", old_string="c = 1", new_string="c = 2"),
                 call("edit_file", path="app.py", old_string="a = 1", new_string="a = 3"),
                 call("finish", answer="edited"))
    task = box.create(title="edit", prompt="set a to 3", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert "2 times" in result(model, 1)["error"]
    assert "not in 'app.py'" in result(model, 2)["error"]
    assert result(model, 3)["replaced"] == 1
    assert content(box, "app.py") == "a = 3\nb = 1\n"


def test_read_search_and_glob_answer_bounded_parts_of_the_files(box: Any, model: FakeModel) -> None:
    (box.home / "src" / "pkg").mkdir(parents=True)
    (box.home / "src" / "pkg" / "mod.py").write_text("".join(f"line {n}\n" for n in range(1, 101)) + "# TODO: fix\n")
    (box.home / "notes.txt").write_text("TODO in a note\n")
    model.answer(call("read_file", path="src/pkg/mod.py", start_line=10, end_line=12),
                 call("search_files", pattern="TODO", glob="*.py"),
                 call("glob_files", pattern="src/**/*.py"),
                 call("finish", answer="looked"))
    task = box.create(title="look", prompt="find the TODOs", budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    read = result(model, 1)
    assert read["content"] == "10: line 10\n11: line 11\n12: line 12" and read["lines"] == "10-12 of 101"
    assert result(model, 2)["matches"] == ["src/pkg/mod.py:101: # TODO: fix"]
    assert result(model, 3)["paths"] == ["src/pkg/mod.py"]


def test_a_command_that_never_ends_is_stopped_at_the_default_timeout(box: Any, model: FakeModel, settings: Any) -> None:
    settings.BOX_AGENT_COMMAND_TIMEOUT_S = 1
    model.answer(call("run_command", command="sleep 60"), call("finish", answer="gave up on it"))
    task = box.create(title="server", prompt="start a server", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed", timeout=30)
    assert done["state"] == "done", done
    assert "timed out after 1s" in result(model, 1)["error"]
    assert "stopped after 1 s" in model.received[0].messages[0]["content"]


def test_the_prompt_has_the_environments_rules_and_the_workspaces_agents_md(box: Any, model: FakeModel) -> None:
    (box.home / "AGENTS.md").write_text("Run the tests with `make check` before you finish.\n")
    model.answer(call("finish", answer="ok"))
    task = box.create(title="rules", prompt="do it", budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    system = model.received[0].messages[0]["content"]
    assert "fresh /bin/sh in the task's own copy" in system
    assert "only the hosts listed below are reachable" in system
    assert "Run the tests with `make check` before you finish." in system


def test_a_vault_secret_the_task_lists_is_usable_as_its_name(box: Any, model: FakeModel) -> None:
    secret = "ghp-vault-value-5e1d0c"
    assert box.api.post("/api/vault", {"name": "GH_TOKEN", "value": secret}, format="json").status_code in (200, 201)
    model.answer(call("run_command", command="printf '%s' '${GH_TOKEN}' > token.txt && cat token.txt"),
                 call("finish", answer="stored"))
    task = box.create(title="token", prompt="store the token", vaultSecrets=["GH_TOKEN"], budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert done["vaultSecrets"] == ["GH_TOKEN"]
    assert content(box, "token.txt") == secret  # the value went in where the command ran
    assert "${GH_TOKEN}" in json.dumps(model.received[0].messages)
    for form in secret_forms(secret):
        assert form not in model.everything_sent()


def test_a_vault_secret_the_vault_does_not_hold_is_refused_at_creation(box: Any) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "prompt": "p", "vaultSecrets": ["NOPE"]}, format="json")
    assert response.status_code == 400 and response.json()["field"] == "vaultSecrets"
