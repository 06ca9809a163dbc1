"""Saved values and files are data: a later step gets the real bytes a step saved (across a
pause, so through the database), while the log, the report and the diff show them redacted."""
from __future__ import annotations

import json

from tasks.layers import paths
from tasks.models import Task, TaskEvent
from tests.conftest import Box, wait_for
from tests.factories import flow
from tests.pauses.helpers import cont, report

SIZES = "sizes: 1 299986 299985 0 bytes"  # 299986 2999 85 0 ... : a list of numbers, not a card
CARD = "4111 1111 1111 1111"


def test_a_saved_value_reaches_later_steps_real_and_is_shown_redacted(box: Box) -> None:
    spec = flow(
        {"run": f"echo '{SIZES}'", "save": "sizes"},
        {"run": "echo ${payment_card}", "save": "card"},
        {"approve": "go on?"},  # the next steps run in a new run: the values come from the database
        {"write": {"path": "out.txt", "content": "${sizes}\ncard=${card}\n"}},
        {"run": "cat out.txt"},
    )
    task = box.create(title="saves", flow=spec, facts={"payment_card": CARD}, secretFacts=["payment_card"])
    box.wait_state(task["id"], "waiting")
    stored = Task.objects.get(pk=task["id"]).records
    assert stored["sizes"] == SIZES  # nothing secret in it: kept as it is
    assert set(stored["card"]) == {"$sealed"} and CARD not in json.dumps(stored)  # sealed, never in clear
    assert cont(box, task["id"], approve=True).status_code == 200
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"

    # The step that used the values got the real bytes.
    written = paths.layer_dir(task["id"]) / "upper" / "out.txt"
    wait_for(lambda: written.is_file() or None, what="the layer to settle")  # the release runs in the background
    assert written.read_text() == f"{SIZES}\ncard={CARD}\n"

    # What is shown: the numbers as they are, the card as its fact's name.
    shown = report(box, task["id"])
    assert shown["records"] == {"sizes": SIZES, "card": "${payment_card}"}
    log = json.dumps([[e.summary, e.data] for e in TaskEvent.objects.filter(task_id=task["id"])])
    assert SIZES in log and CARD not in log and CARD.replace(" ", "") not in log
    diff = box.api.get(f"/api/tasks/{task['id']}/diff").json()["diff"]
    assert SIZES in diff and "card=${payment_card}" in diff and CARD not in diff
