"""Attack: a task's command hunts for other tasks' layers through the lower mounts of its view.

A sandboxed overlay view stacks lower layers id-mapped (``tasks.layers.overlay._mount_idmapped``):
detached copies of each directory of layers, given to overlayfs by descriptor, or on a kernel
before 6.15 the same copies mounted on the host (one mount per directory of layers), which show
every layer of the data directory. The task's root holds its view alone; nothing it can name
(the view's mount options, /proc, its file descriptors, a walk of its tree) leads to them.
Each test runs both ways.
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tasks.layers import mounts, overlay
from tasks.layers import paths as layer_paths
from tasks.run import lifecycle
from tasks.workers import file_steps
from tests.conftest import wait_for
from tests.factories import flow
from tests.sandbox.conftest import data_dir_where_a_box_keeps_it, needs_sandbox, results

pytestmark = needs_sandbox


@pytest.fixture(autouse=True, params=["by descriptor", "attached"])
def lower_mounting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the view's lower layers reach overlayfs: by descriptor where the kernel takes them so,
    else mounted under the task's own directory of lower mounts (forced here for the second)."""
    if request.param == "attached":
        monkeypatch.setattr(overlay, "layers_by_fd_refusal", lambda: "as on a kernel before 6.15")
    elif overlay.layers_by_fd_refusal() is not None:
        pytest.skip(f"this kernel: {overlay.layers_by_fd_refusal()}")
    return str(request.param)

HUNT = textwrap.dedent("""
    import os, sys
    data, secret_name, *ids = sys.argv[1:]
    found = []
    def look(path):
        try:
            if os.path.isdir(path):
                names = os.listdir(path)
                if secret_name in names or any(i in names for i in ids):
                    found.append(path)
            elif secret_name in path:
                open(path).read()
                found.append(path)
        except OSError:
            pass
    mounts = open("/proc/self/mountinfo").read()
    print("mentions_ids=%s" % any(i in mounts for i in ids))
    named = set()
    for line in mounts.splitlines():
        for option in line.split(" - ", 1)[-1].replace(":", ",").split(","):
            value = option.split("=", 1)[-1]
            if value.startswith("/"):
                named.add(value)
    for path in sorted(named):
        while path not in ("", "/"):
            look(path)
            for i in ids:
                look(os.path.join(path, i, "upper", secret_name))
            path = os.path.dirname(path)
    for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["self", "thread-self"]:
        for i in ids:
            look("/proc/%s/root%s/layers/%s/upper/%s" % (pid, data, i, secret_name))
            look("/proc/%s/cwd/../../../layers/%s/upper/%s" % (pid, i, secret_name))
    for fd in os.listdir("/proc/self/fd"):
        look("/proc/self/fd/%s" % fd)
        look("/proc/self/fd/%s/.." % fd)
    for where, dirs, names in os.walk("/"):
        if where in ("/proc", "/sys", "/usr", "/dev"):
            dirs[:] = []
            continue
        if secret_name in names or any(i in dirs for i in ids):
            found.append(where)
    print("found=" + ",".join(found))
    print("own_view=" + open("stacked.txt").read().strip())
""")


def test_a_task_cannot_reach_another_tasks_layer_through_its_views_lower_mounts(sandboxed, settings):
    secret_name = f"secret-{os.getpid()}.txt"
    with data_dir_where_a_box_keeps_it(settings, "lowers") as data:
        stacked = sandboxed.create(title="stacked", flow=flow({"write": {"path": "stacked.txt", "content": "mine\n"}}))
        assert sandboxed.wait_state(stacked["id"], "done")["state"] == "done"
        failed = sandboxed.create(title="secret keeper", flow=flow(
            {"write": {"path": secret_name, "content": "s3cret\n"}}, {"run": "exit 3"}))
        assert sandboxed.wait_state(failed["id"], "failed")["state"] == "failed"
        wait_for(lambda: (layer_paths.layer_dir(failed["id"]) / "upper" / secret_name).exists(), timeout=30,
                 what="the failed task's layer settled on the data directory")
        thief = sandboxed.create(title="thief", prompt="p", worker="command", command=[
            "/usr/bin/python3", "-c", HUNT, str(data), secret_name, failed["id"], stacked["id"]])
        view = sandboxed.wait_state(thief["id"], "done", "failed")
        seen = results(sandboxed, view["id"])
        assert view["state"] == "done", (view, seen)
        assert seen["own_view"] == "mine"  # the stacked layer is read through the view, as it should be
        assert seen["mentions_ids"] == "False"
        assert seen["found"] == ""


def test_a_sandboxed_views_lower_layers_are_mounted_on_the_host_only_where_the_kernel_needs_it(
        sandboxed: Any, lower_mounting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    write = file_steps.write_regular

    def looking(target: Path, content: str) -> None:  # the second task's write, its view open
        task_id = target.parent.parent.name
        seen.update(view=mounts.mounts_under(layer_paths.task_dir(task_id)),
                    lowers=mounts.mounts_under(layer_paths.lower_mounts_dir(task_id)),
                    owner=os.stat(target.parent / "a.txt").st_uid)
        write(target, content)

    first = sandboxed.create(title="first", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    assert sandboxed.wait_state(first["id"], "done")["state"] == "done"
    monkeypatch.setattr(file_steps, "write_regular", looking)
    second = sandboxed.create(title="second", flow=flow({"write": {"path": "b.txt", "content": "b"}}))
    assert sandboxed.wait_state(second["id"], "done")["state"] == "done"
    assert seen["view"] == [layer_paths.view_dir(second["id"])]
    assert seen["owner"] != 0  # the first task's file, root's on disk, is the second task's user's in its view
    if lower_mounting == "by descriptor":
        assert seen["lowers"] == []  # nothing but the view: nothing else to unmount, nothing left by a crash
    else:
        assert seen["lowers"]
    assert lifecycle.janitor.drain()
    assert mounts.mounts_under(layer_paths.task_dir(second["id"]), layer_paths.lower_mounts_dir(second["id"])) == []
