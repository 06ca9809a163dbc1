"""The stack: what later tasks see, and how endings and undo change it (the reference scenarios)."""
from __future__ import annotations

from tests.factories import flow
from tests.layers.conftest import diff_of, read, undo


def test_later_tasks_see_done_work_and_undo_keeps_later_versions(lbox):
    a = lbox.create(title="A", flow=flow({"write": {"path": "a.txt", "content": "A\n"}}))
    lbox.wait_state(a["id"], "done")
    assert read(lbox, "a.txt") == "A\n"

    b = lbox.create(title="B", flow=flow({"run": "cat a.txt > seen.txt"}))
    b = lbox.wait_state(b["id"], "done")
    assert b["layers"] == [a["id"]]
    assert read(lbox, "seen.txt") == "A\n"

    c = lbox.create(title="C", flow=flow({"write": {"path": "a.txt", "content": "C\n"}}))
    c = lbox.wait_state(c["id"], "done")
    assert c["layers"] == [b["id"], a["id"]]
    change = diff_of(lbox, c["id"])
    assert change["modified"] == ["a.txt"] and change["added"] == [] and change["deleted"] == []
    assert "-A\n+C\n" in change["diff"]

    assert undo(lbox, a["id"])["state"] == "undone"
    assert read(lbox, "a.txt") == "C\n"  # the later task's version stays
    assert diff_of(lbox, a["id"])["added"] == []  # an undone task's diff is empty

    undo(lbox, c["id"])
    assert read(lbox, "a.txt") is None
    assert read(lbox, "seen.txt") == "A\n"  # B keeps its change

    d = lbox.create(title="D", flow=flow({"run": "test ! -e a.txt && cat seen.txt"}))
    d = lbox.wait_state(d["id"], "done", "failed")
    assert d["state"] == "done", d["error"]
    assert d["layers"] == [b["id"]]
