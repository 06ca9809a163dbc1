"""Attack: a task's command hunts for other tasks' layers through the lower mounts of its view.

A sandboxed overlay view stacks lower layers that the box mounts id-mapped on the host (one
mount per directory of layers, ``tasks.layers.overlay._idmapped``): those mounts show every
layer of the data directory. The task's root holds its view alone; nothing it can name (the
view's mount options, /proc, its file descriptors, a walk of its tree) leads to them.
"""
from __future__ import annotations

import os
import textwrap

from tasks.layers import paths as layer_paths
from tests.conftest import wait_for
from tests.factories import flow
from tests.sandbox.conftest import data_dir_where_a_box_keeps_it, needs_sandbox, results

pytestmark = needs_sandbox

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
