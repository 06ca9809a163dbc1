"""The stack: what later tasks see, and how endings and undo change it (the reference scenarios)."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from tasks.layers import compaction, stack_record, task_view
from tasks.layers import paths as layer_paths
from tasks.layers.locks import workspace_lock
from tasks.layers.tree import Meta
from tasks.models import Condition, Dependency, Layer, LayerState, Task, Workspace
from tasks.run import lifecycle
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


def test_a_failed_tasks_change_is_in_its_diff_and_in_no_later_task(lbox):
    bad = lbox.create(title="bad", flow=flow({"write": {"path": "b.txt", "content": "half done\n"}}, {"run": "exit 4"}))
    bad = lbox.wait_state(bad["id"], "failed")
    change = diff_of(lbox, bad["id"])
    assert change["added"] == ["b.txt"]
    assert "+half done" in change["diff"]
    assert read(lbox, "b.txt") is None

    later = lbox.create(title="later", flow=flow({"run": "test ! -e b.txt"}))
    later = lbox.wait_state(later["id"], "done", "failed")
    assert later["state"] == "done", later["error"]
    assert later["layers"] == []

    undo(lbox, bad["id"])
    assert diff_of(lbox, bad["id"])["added"] == []


def test_deletions_and_replaced_directories_show_in_the_diff_and_the_view(lbox):
    setup = lbox.create(title="setup", flow=flow(
        {"write": {"path": "keep.txt", "content": "k\n"}},
        {"write": {"path": "gone.txt", "content": "g\n"}},
        {"write": {"path": "d/x.txt", "content": "x\n"}},
        {"write": {"path": "d/sub/y.txt", "content": "y\n"}},
    ))
    lbox.wait_state(setup["id"], "done")
    change = lbox.create(title="change", flow=flow(
        {"delete": "gone.txt"},
        {"run": "rm -rf d && mkdir d && echo new > d/z.txt"},
    ))
    change = lbox.wait_state(change["id"], "done", "failed")
    assert change["state"] == "done", change["error"]
    body = diff_of(lbox, change["id"])
    assert body["deleted"] == ["d/sub/y.txt", "d/x.txt", "gone.txt"]
    assert body["added"] == ["d/z.txt"]
    assert body["modified"] == []
    listing = lbox.api.get("/api/workspaces/home/files", {"path": "d"}).json()
    assert [e["name"] for e in listing["entries"]] == ["z.txt"]
    assert read(lbox, "keep.txt") == "k\n" and read(lbox, "gone.txt") is None


def test_a_binary_file_is_named_in_the_diff_not_dumped(lbox):
    task = lbox.create(title="bin", flow=flow(
        {"run": "printf 'GIF89a\\000\\001\\002\\377' > pic.gif && echo text > notes.txt"}))
    task = lbox.wait_state(task["id"], "done", "failed")
    assert task["state"] == "done", task["error"]
    body = diff_of(lbox, task["id"])
    assert body["added"] == ["notes.txt", "pic.gif"]
    assert body["binary"] == ["pic.gif"]
    assert "Binary files /dev/null and b/pic.gif differ" in body["diff"]
    assert "GIF89a" not in body["diff"] and "+text" in body["diff"]
    response = lbox.api.get("/api/workspaces/home/files", {"path": "pic.gif"}).json()
    assert response["binary"] is True and response["content"] is None and response["size"] == 10


def test_deep_stacks_are_compacted_without_losing_a_file_and_rebuilt_after_an_undo_beneath(lbox, settings):
    settings.BOX_LAYER_MAX_DEPTH = 3
    done = []
    for n in range(8):
        steps = [{"write": {"path": f"f{n}.txt", "content": f"{n}\n"}}]
        if n == 5:
            steps.append({"write": {"path": "f1.txt", "content": "1 changed by 5\n"}})
        if n == 6:
            steps.append({"delete": "f0.txt"})
        task = lbox.create(title=f"t{n}", flow={"steps": steps})
        task = lbox.wait_state(task["id"], "done", "failed")
        assert task["state"] == "done", task["error"]
        done.append(task["id"])
    workspace = lbox.api.get("/api/workspaces/home").json()
    assert workspace["stack"]["compacted"], workspace
    assert workspace["stack"]["depth"] <= 3 + 1
    assert workspace["stack"]["flats"] == 2  # f0's deletion in the newer flat hides it in the older
    expected = {f"f{n}.txt": f"{n}\n" for n in range(1, 8)} | {"f1.txt": "1 changed by 5\n"}
    check = lbox.create(title="check", flow=flow({"run": "for f in f*.txt; do printf '%s=' $f; cat $f; done > all.out"}))
    check = lbox.wait_state(check["id"], "done", "failed")
    assert check["state"] == "done", check["error"]
    assert read(lbox, "all.out") == "".join(f"{k}={v}" for k, v in sorted(expected.items()))
    assert check["layers"] == list(reversed(done))

    undo(lbox, done[2])  # beneath the flat: the next task gets a rebuilt one
    undo(lbox, done[6])  # f0.txt's deletion goes: f0 is back
    after = lbox.create(title="after", flow=flow({"run": "for f in f*.txt; do printf '%s=' $f; cat $f; done > after.out"}))
    after = lbox.wait_state(after["id"], "done", "failed")
    assert after["state"] == "done", after["error"]
    expected = {k: v for k, v in expected.items() if k not in ("f2.txt", "f6.txt")} | {"f0.txt": "0\n"}
    assert read(lbox, "after.out") == "".join(f"{k}={v}" for k, v in sorted(expected.items()))
    assert done[2] not in lbox.api.get("/api/workspaces/home").json()["stack"]["compacted"]


def test_a_start_and_a_release_over_a_compacted_stack_leave_the_layers_inside_its_flat_alone(lbox, settings, monkeypatch):
    """The layer work of a start and a release is bounded by the compaction depth. A
    layer inside a cached flat is sealed for good: neither is it sealed again, nor its meta read."""
    settings.BOX_LAYER_MAX_DEPTH = 4
    for n in range(10):
        task = lbox.create(title=f"t{n}", flow=flow({"write": {"path": f"f{n}.txt", "content": f"{n}\n"}}))
        assert lbox.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert lifecycle.janitor.drain()
    inside = set(lbox.api.get("/api/workspaces/home").json()["stack"]["compacted"])
    assert len(inside) == 8

    sealed: list[str] = []
    read_metas: list[str] = []
    seal_layer, load = task_view.seal_layer, Meta.load

    def counting_seal(task_id: str, **options: Any) -> None:
        sealed.append(task_id)
        seal_layer(task_id, **options)

    def counting_load(directory: Path) -> Meta:
        read_metas.append(Path(directory).name)
        return load(directory)

    monkeypatch.setattr(task_view, "seal_layer", counting_seal)
    monkeypatch.setattr(Meta, "load", counting_load)
    last = lbox.create(title="over the flat", flow=flow({"run": "cat f0.txt f9.txt > both.out"}))
    last = lbox.wait_state(last["id"], "done", "failed")
    assert last["state"] == "done", last["error"]
    assert lifecycle.janitor.drain()
    assert read(lbox, "both.out") == "0\n9\n"
    assert last["id"] in sealed and not inside & set(sealed)
    assert not inside & set(read_metas)


def test_a_flat_a_seal_reads_is_not_swept_until_the_seal_is_done(lbox, settings):
    settings.BOX_LAYER_MAX_DEPTH = 2
    for n in range(4):
        task = lbox.create(title=f"t{n}", flow=flow({"write": {"path": f"f{n}.txt", "content": f"{n}\n"}}))
        assert lbox.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert lifecycle.janitor.drain()
    workspace = Workspace.objects.get(name="home")
    with compaction.read_trees(workspace, task_view.current_stack(workspace)) as trees:
        flat = trees[-1].root.parent
        assert flat.parent == layer_paths.flats_dir(workspace.pk)
        with workspace_lock(workspace.pk):
            compaction.sweep_flats(workspace, set())
        assert (flat / "ids.json").exists()
    with workspace_lock(workspace.pk):
        compaction.sweep_flats(workspace, set())
    assert not flat.exists()


def test_the_current_stack_is_what_the_orm_reads(lbox):
    for n in range(4):
        task = lbox.create(title=f"t{n}", flow=flow({"write": {"path": f"f{n}.txt", "content": f"{n}\n"}}))
        assert lbox.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert lifecycle.janitor.drain()
    workspace = Workspace.objects.get(name="home")
    layers = Layer.objects.filter(workspace=workspace)
    layers.filter(task_id=task["id"]).update(state=LayerState.DISCARDED)  # undone: not in the stack
    layers.exclude(task_id=task["id"]).update(applied_at=timezone.now())  # one time: the newest row first
    expected = list(layers.filter(state=LayerState.APPLIED).order_by("-applied_at", "-pk").values_list("task_id", flat=True))
    assert len(expected) == 3
    assert task_view.current_stack(workspace) == task_view.current_stack(workspace.pk) == expected


def test_the_stack_a_start_records_is_what_the_orm_reads(lbox):
    """A start's stack (one statement on PostgreSQL, a transaction on SQLite) leaves out only a
    layer not sealed, applied after the task's creation, of a task it does not depend on."""
    done = []
    for n in range(5):
        task = lbox.create(title=f"t{n}", flow=flow({"write": {"path": f"f{n}.txt", "content": f"{n}\n"}}))
        assert lbox.wait_state(task["id"], "done", "failed")["state"] == "done"
        done.append(task["id"])
    assert lifecycle.janitor.drain()
    workspace = Workspace.objects.get(name="home")
    created = timezone.now()
    reader = Task.objects.create(owner=lbox.owner, title="reader", workspace=workspace, worker="flow")
    Task.objects.filter(pk=reader.pk).update(created_at=created)
    reader.created_at = created
    before, after = created - timedelta(seconds=1), created + timedelta(seconds=1)
    rows = Layer.objects.filter(workspace=workspace)
    rows.filter(task_id=done[0]).update(applied_at=before, sealed=False)  # done before the task was asked for
    rows.filter(task_id=done[1]).update(applied_at=created, sealed=False)  # at the same moment: before, too
    rows.filter(task_id=done[2]).update(applied_at=after, sealed=True)  # after, sealed
    rows.filter(task_id=done[3]).update(applied_at=after + timedelta(seconds=1), sealed=False)  # after, not sealed: out
    rows.filter(task_id=done[4]).update(applied_at=after + timedelta(seconds=2), sealed=False)  # after, but depended on
    Dependency.objects.create(task=reader, on_id=done[4], condition=Condition.COMPLETION)

    stack_record.record_layer(reader)
    depended = Exists(Dependency.objects.filter(task=reader, on_id=OuterRef("task_id")))
    expected = list(rows.filter(state=LayerState.APPLIED).filter(Q(sealed=True) | Q(applied_at__lte=created) | depended)
                    .order_by("-applied_at", "-pk").values_list("task_id", flat=True))
    assert reader.layers == expected == [done[4], done[2], done[1], done[0]]
    assert Task.objects.get(pk=reader.pk).layers == expected
    assert task_view.current_stack(workspace) == [done[4], done[3], done[2], done[1], done[0]]  # the browse: all of them
