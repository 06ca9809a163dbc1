"""Resource limits: a task that exceeds its memory fails with a clear error and harms nothing else;
its CPU is capped; a limit the box cannot enforce is refused, and /api/health says what holds."""
from __future__ import annotations

import textwrap

from django.test import Client

from tasks.sandbox import cgroups
from tests.factories import flow
from tests.sandbox.conftest import needs_sandbox, results

pytestmark = needs_sandbox

HOG = textwrap.dedent("""
    chunks = []
    for _ in range(64):
        chunks.append(b"x" * (16 * 1024 * 1024))  # written, so really resident: 1 GB in all
    print("survived=yes")
""")

BUSY = textwrap.dedent("""
    import time
    wall, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - wall < 1.5:
        pass
    print("share=%.3f" % ((time.process_time() - cpu) / (time.monotonic() - wall)))
""")


def _command(box, script, **spec):
    task = box.create(title=spec.pop("title", "limits"), prompt="p", worker="command",
                      command=["/usr/bin/python3", "-c", script], **spec)
    return box.wait_state(task["id"], "done", "failed", timeout=60)


def test_a_task_over_its_memory_fails_clearly_and_the_next_task_runs(sandboxed):
    if cgroups.unavailable():
        raise AssertionError(f"this machine runs the sandbox tests as root, so limits must hold: {cgroups.unavailable()}")
    view = _command(sandboxed, HOG, title="hog", limits={"memory_mb": 64})
    assert view["state"] == "failed", view
    assert view["error"] == "memory limit of 64 MB reached", view["error"]
    assert "survived" not in results(sandboxed, view["id"])
    assert view["limits"]["memory_mb"] == 64
    # The box (this process runs it) and the next task are untouched.
    after = _command(sandboxed, 'print("fine=yes")', title="next")
    assert after["state"] == "done" and results(sandboxed, after["id"])["fine"] == "yes"
    assert after["limits"]["memory_mb"] == 2048  # the default from settings


def test_a_task_cannot_take_more_cpu_than_its_share(sandboxed):
    view = _command(sandboxed, BUSY, title="busy", limits={"cpu_percent": 20})
    assert view["state"] == "done", view
    assert float(results(sandboxed, view["id"])["share"]) <= 0.3


def test_limits_out_of_range_are_refused_and_health_says_what_holds(sandboxed):
    disk = sandboxed.api.post("/api/tasks", {"title": "t", "prompt": "p", "limits": {"disk_mb": 8}}, format="json")
    assert disk.status_code == 400 and disk.json()["field"] == "limits.disk_mb", disk.json()
    greedy = sandboxed.api.post("/api/tasks", {"title": "t", "prompt": "p", "limits": {"cpu_percent": 100_000}}, format="json")
    assert greedy.status_code == 400 and greedy.json()["field"] == "limits.cpu_percent", greedy.json()
    tiny = sandboxed.api.post("/api/tasks", {"title": "t", "prompt": "p", "limits": {"memory_mb": 1}}, format="json")
    assert tiny.status_code == 400 and tiny.json()["field"] == "limits.memory_mb", tiny.json()
    limits = sandboxed.api.get("/api/health").json()["isolation"]["limits"]
    assert limits["memory"]["enforced"] is True and limits["memory"]["default_mb"] == 2048
    assert limits["cpu"]["enforced"] is True
    assert limits["disk"]["enforced"] is True and limits["disk"]["default_mb"] == 10240


def test_a_flow_step_over_the_memory_limit_fails_the_task_with_the_limit_named(sandboxed):
    task = sandboxed.create(title="flow hog", limits={"memory_mb": 48}, flow=flow(
        {"run": "python3 -c 'b = [b\"x\" * 2**24 for _ in range(32)]' && echo survived"},
    ))
    view = sandboxed.wait_state(task["id"], "done", "failed", timeout=60)
    assert view["state"] == "failed" and view["error"] == "memory limit of 48 MB reached", view


def test_the_owner_sets_the_defaults_on_the_settings_page_and_new_tasks_get_them(sandboxed):
    page = Client()
    page.force_login(sandboxed.owner)
    html = page.get("/settings").content.decode()
    assert 'name="taskMemoryMb"' in html and 'value="2048"' in html and 'name="taskCpuPercent"' in html
    changed = sandboxed.api.patch("/api/settings", {"taskMemoryMb": 512, "taskCpuPercent": 50, "taskDiskMb": 64},
                                  format="json")
    assert changed.status_code == 200 and changed.json()["taskMemoryMb"] == 512, changed.json()
    assert changed.json()["taskDiskMb"] == 64
    assert 'value="512"' in page.get("/settings").content.decode()
    task = sandboxed.create(title="defaults", flow=flow({"run": "true"}))
    assert task["limits"]["memory_mb"] == 512 and task["limits"]["cpu_percent"] == 50 and task["limits"]["disk_mb"] == 64
    own = sandboxed.create(title="own", flow=flow({"run": "true"}), limits={"memory_mb": 256})
    assert own["limits"]["memory_mb"] == 256 and own["limits"]["cpu_percent"] == 50
    for body, field in (({"taskMemoryMb": 8}, "taskMemoryMb"), ({"taskCpuPercent": 0}, "taskCpuPercent"),
                        ({"taskCpuPercent": 100_000}, "taskCpuPercent"), ({"taskDiskMb": 8}, "taskDiskMb")):
        bad = sandboxed.api.patch("/api/settings", body, format="json")
        assert bad.status_code == 400 and bad.json()["field"] == field, bad.json()
