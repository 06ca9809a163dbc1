"""Files and directories a step creates belong to the task's user, on both layer drivers."""
from __future__ import annotations

from tests.factories import flow
from tests.layers.conftest import read


def test_a_later_run_step_can_append_to_a_file_written_into_a_new_subdirectory(lbox):
    task = lbox.create(title="subdir", flow=flow(
        {"write": {"path": "sub/deeper/a.txt", "content": "a\n"}},
        {"run": "echo x >> sub/deeper/a.txt && mkdir sub/deeper/more && touch sub/new.txt"},
    ))
    view = lbox.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert read(lbox, "sub/deeper/a.txt") == "a\nx\n"
