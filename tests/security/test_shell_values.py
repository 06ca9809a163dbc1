"""Attack: a webhook payload (or any fact) substituted into a ``run`` step is data, never code.

Before the fix ``${payload.title}`` was pasted into the ``sh -c`` text, so a title of
``$(touch pwned)`` ran ``touch``. Each value now reaches the shell as an environment variable.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from schedules.signatures import timestamped_header
from tasks.workers.values import shell_command
from tests.conftest import Box

PAYLOADS = [
    "$(touch pwned-subst)",
    "`touch pwned-backquote`",
    "x; touch pwned-semicolon",
    "x' ; touch pwned-single '",
    'x" ; touch pwned-double "',
    "a\\ b\n touch pwned-newline",
    "*",
]


def _workdir_files(box: Box, task_id: str) -> list[str]:
    response = box.api.get(f"/api/tasks/{task_id}/diff")
    assert response.status_code == 200, response.json()
    body = response.json()
    return [*body["added"], *body["modified"]]


@pytest.mark.parametrize("title", PAYLOADS)
def test_a_webhook_payload_in_a_run_step_is_never_executed(box: Box, title: str) -> None:
    template = {"title": "hook", "flow": {"steps": [
        {"run": "printf '%s|' ${payload.title} > unquoted.txt"},
        {"run": 'printf "%s|" "${payload.title}" > double.txt'},
        {"run": "printf '%s|' '${payload.title}' > single.txt"},
        {"run": "cat unquoted.txt double.txt single.txt", "save": "echoed"},
    ]}}
    created = box.api.post("/api/triggers", {"name": "gh", "kind": "webhook", "template": template}, format="json")
    assert created.status_code == 201, created.json()
    hook = created.json()
    body = json.dumps({"title": title}).encode()
    delivered = Client().post(hook["path"], data=body, content_type="application/json",
                              HTTP_X_BOX_SIGNATURE=timestamped_header(hook["secret"], body, int(time.time())))
    assert delivered.status_code == 202, delivered.json()
    task_id = delivered.json()["task"]
    view = box.wait_state(task_id, "done", "failed")
    assert view["state"] == "done", view
    files = _workdir_files(box, task_id)
    assert not [f for f in files if "pwned" in f], f"the payload ran as a command: {files}"
    # And the value arrives whole, as one word, in every quoting context.
    records = box.api.get(f"/api/tasks/{task_id}/report").json()["records"]
    assert records["echoed"] == f"{title}|" * 3


def test_the_rewritten_command_quotes_a_value_for_where_it_stands() -> None:
    values: dict[str, Any] = {"a": "$(id)", "b": "two words"}
    cmd, env = shell_command("""echo ${a} "x ${b}" 'y ${a}' \\${a} ${unknown}""", values)
    assert env == {"BOX_VALUE_1": "$(id)", "BOX_VALUE_2": "two words"}
    # An escaped \\${a} stays as written; an unknown name is left for the shell, as before.
    assert cmd == """echo "${BOX_VALUE_1}" "x ${BOX_VALUE_2}" 'y '"${BOX_VALUE_1}"'' \\${a} ${unknown}"""


def test_values_in_env_and_other_steps_are_still_substituted(box: Box, tmp_path: Path) -> None:
    task = box.create(title="env", facts={"who": "Ada $(id)"}, flow={"steps": [
        {"run": {"cmd": 'printf %s "$GREETING"', "env": {"GREETING": "hi ${who}"}}, "save": "greeting"},
        {"write": {"path": "who.txt", "content": "${who}"}},
        {"run": "cat who.txt", "save": "file"},
    ]})
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view
    records = box.api.get(f"/api/tasks/{task['id']}/report").json()["records"]
    assert records == {"greeting": "hi Ada $(id)", "file": "Ada $(id)"}
