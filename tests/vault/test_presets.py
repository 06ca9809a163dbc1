"""Command presets get the vault keys they declare as environment variables, or fail first."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet


@pytest.fixture
def preset(box: Any, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A custom preset `mine` whose process is a local script (in the workspace, so the task sees
    it inside its sandbox) that needs MY_API_KEY."""
    monkeypatch.setenv("BOX_SECRET_KEY", Fernet.generate_key().decode())
    script = box.home / "agent.sh"
    script.write_text(
        "#!/bin/sh\n"
        'echo "agent started"\n'
        'echo "using key $MY_API_KEY for: $1"\n'
        '[ "$MY_API_KEY" = "the-real-key-123" ] || { echo "wrong key" >&2; exit 9; }\n'
    )
    script.chmod(0o755)
    presets = tmp_path / "presets.json"
    presets.write_text(json.dumps([{"name": "mine", "argv": ["/bin/sh", "agent.sh", "{prompt}"], "keys": ["MY_API_KEY"]}]))
    settings.BOX_PRESETS_FILE = str(presets)
    return script


def test_a_missing_preset_key_becomes_one_question_whose_answer_goes_to_the_vault(box: Any, preset: Path) -> None:
    task = box.create(title="needs a key", worker="mine", prompt="summarise")
    view = box.wait_state(task["id"], "waiting", "failed")
    assert view["waitingFor"] == "input", view
    # the agent never started: no "starting" step, not a line of its output
    assert not [e for e in box.events(task["id"]) if e["kind"] in ("step", "output")]
    [question] = [q for q in box.task(task["id"])["questions"] if q["state"] == "open"]
    assert [(f["name"], f["kind"]) for f in question["fields"]] == [("MY_API_KEY", "vault")]
    answered = box.api.post(f"/api/questions/{question['id']}/answer", {"inputs": {"MY_API_KEY": "the-real-key-123"}},
                            format="json")
    assert answered.status_code == 200, answered.json()
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view
    assert "MY_API_KEY" in [s["name"] for s in box.api.get("/api/vault").json()["secrets"]]
    assert "MY_API_KEY" not in view["facts"]
    everything = box.api.get(f"/api/tasks/{task['id']}/report").content.decode() + str(box.events(task["id"]))
    assert "the-real-key-123" not in everything


def test_a_preset_gets_its_key_as_an_environment_variable_and_the_log_never_shows_it(box: Any, preset: Path) -> None:
    box.api.post("/api/vault", {"name": "MY_API_KEY", "value": "the-real-key-123"}, format="json")
    task = box.create(title="has a key", worker="mine", prompt="summarise")
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    outputs = [e["summary"] for e in box.events(task["id"]) if e["kind"] == "output"]
    assert outputs == ["agent started", "using key ${MY_API_KEY} for: summarise"]
    assert "the-real-key-123" not in box.api.get(f"/api/tasks/{task['id']}").content.decode()


@pytest.fixture
def cli_preset(box: Any, tmp_path: Path, settings: Any) -> None:
    """A preset `cli` like an external agent CLI: it writes a session file under its HOME, a
    change in the workspace, and says where its HOME is; its API is on api.cli.test."""
    script = box.home / "cli.sh"
    script.write_text(
        "#!/bin/sh\n"
        'mkdir -p "$HOME/.cli" && echo session > "$HOME/.cli/session.json"\n'
        "echo made > made.txt\n"
        'echo "home: $HOME"\n'
    )
    script.chmod(0o755)
    presets = tmp_path / "cli-presets.json"
    presets.write_text(json.dumps([{"name": "cli", "argv": ["/bin/sh", "cli.sh", "{prompt}"], "hosts": ["api.cli.test"]}]))
    settings.BOX_PRESETS_FILE = str(presets)


def test_a_preset_asks_once_for_its_api_host_and_the_owners_ok_adds_it_to_the_tasks_hosts(box: Any, cli_preset: None) -> None:
    task = box.create(title="needs its API", worker="cli", prompt="go", hosts=["example.org"])
    view = box.wait_state(task["id"], "waiting", "done", "failed")
    assert view["waitingFor"] == "approval", view
    assert not [e for e in box.events(task["id"]) if e["kind"] == "output"]  # nothing ran before the OK
    [approval] = [a for a in box.task(task["id"])["approvals"] if a["state"] == "pending"]
    assert approval["detail"]["hosts"] == ["api.cli.test"] and "api.cli.test" in approval["summary"]
    approved = box.api.post(f"/api/approvals/{approval['id']}/approve", {}, format="json")
    assert approved.status_code == 200, approved.json()
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert view["hosts"] == ["example.org", "api.cli.test"]


def test_a_preset_whose_hosts_the_task_lists_asks_nothing(box: Any, cli_preset: None) -> None:
    task = box.create(title="listed", worker="cli", prompt="go", hosts=["*.cli.test"])
    view = box.wait_state(task["id"], "waiting", "done", "failed")
    assert view["state"] == "done", view


def test_a_presets_dotfiles_live_in_a_home_of_its_own_never_in_the_diff(box: Any, cli_preset: None) -> None:
    task = box.create(title="dotfiles", worker="cli", prompt="go", hosts=["api.cli.test"])
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    diff = box.api.get(f"/api/tasks/{task['id']}/diff").json()
    assert diff["added"] == ["made.txt"], diff
    [home] = [e["summary"] for e in box.events(task["id"]) if e["kind"] == "output"]
    assert home.startswith("home: /") and not (box.home / ".cli").exists()
