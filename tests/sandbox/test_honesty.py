"""Without the sandbox the box says so (health, the task's first event, Task.isolation) and still
offers listed hosts through its proxy, by environment variables only."""
from __future__ import annotations

import os
import textwrap

import pytest

from tasks.sandbox import support, syscall_filter
from tests.sandbox.conftest import results
from tests.sandbox.test_network import host_server  # noqa: F401 - a fixture

PROXIED = textwrap.dedent("""
    import os, sys, urllib.request, urllib.error
    port = int(sys.argv[1])
    proxy = os.environ.get("HTTP_PROXY")
    print("proxy=%s" % proxy)
    print("uid=%d" % os.getuid())
    for name in ("NO_PROXY", "no_proxy"):
        os.environ.pop(name, None)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
    for name, url in (("listed", "http://127.0.0.1:%d/hi" % port), ("not_listed", "http://not-listed.example/")):
        try:
            with opener.open(url, timeout=10) as r:
                print("%s=ok %d" % (name, r.status))
        except urllib.error.HTTPError as e:
            print("%s=refused %d" % (name, e.code))
""")


@pytest.fixture
def unsandboxed(box, settings):
    settings.BOX_SANDBOX = "off"
    return box


def test_health_says_when_there_is_no_sandbox_and_why(unsandboxed):
    body = unsandboxed.api.get("/api/health").json()
    isolation = body["isolation"]
    assert isolation["sandbox"] is False and isolation["mode"] == "off"
    assert isolation["reason"] == "the sandbox is turned off (BOX_SANDBOX=off)"
    assert "proxy environment variables only" in isolation["summary"]
    assert isolation["limits"]["memory"]["enforced"] is False and isolation["limits"]["cpu"]["enforced"] is False
    assert isolation["limits"]["disk"]["enforced"] is False
    assert isolation["limits"]["disk"]["how"] == "not enforced: tasks are not sandboxed; limits.disk_mb is refused"


@pytest.mark.parametrize("limit", ["memory_mb", "cpu_percent", "disk_mb"])
def test_a_resource_limit_the_box_cannot_enforce_is_refused(unsandboxed, limit):
    response = unsandboxed.api.post("/api/tasks", {"title": "t", "prompt": "p", "limits": {limit: 64}}, format="json")
    body = response.json()
    assert response.status_code == 400 and body["code"] == "NOT_AVAILABLE" and body["field"] == f"limits.{limit}", body
    assert "cannot be enforced on this box: the sandbox is turned off" in body["message"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root box can sandbox")
def test_health_says_so_when_tasks_are_sandboxed(box, settings):
    settings.BOX_SANDBOX = "auto"
    isolation = box.api.get("/api/health").json()["isolation"]
    assert isolation["sandbox"] is True and "network" in isolation["namespaces"]
    assert isolation["mode"] == "root" and isolation["missing"] == []
    assert "seccomp filter" in isolation["syscalls"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root box can sandbox")
def test_without_libseccomp_the_box_refuses_tasks_and_says_why(box, settings, monkeypatch):
    settings.BOX_SANDBOX = "auto"
    monkeypatch.setattr(syscall_filter, "LIBRARY", "libseccomp-missing.so.2")
    support._system_missing.cache_clear()
    try:
        isolation = box.api.get("/api/health").json()["isolation"]
        assert isolation["mode"] == "refused", isolation
        assert isolation["missing"] == ["the system-call filter cannot be had: libseccomp-missing.so.2 cannot be loaded "
                                        "(libseccomp-missing.so.2: cannot open shared object file: No such file or "
                                        "directory) (apt install libseccomp2)"]
        task = box.create(title="t", prompt="p", worker="command", command=["/bin/true"])
        view = box.wait_state(task["id"], "done", "failed")
        assert view["state"] == "failed" and view["error"].startswith("not run: this box cannot sandbox tasks (the "
                                                                      "system-call filter cannot be had"), view
        assert "set BOX_SANDBOX=off" in view["error"] and view["hint"] == support.FIX
        assert not [e for e in box.events(task["id"]) if e["kind"] == "output"]
    finally:
        monkeypatch.undo()
        support._system_missing.cache_clear()


def test_an_unsandboxed_task_says_so_first_and_uses_the_proxy_environment(unsandboxed, host_server):  # noqa: F811
    task = unsandboxed.create(title="plain", prompt="p", worker="command", hosts=["127.0.0.1"],
                              command=["/usr/bin/python3", "-c", PROXIED, str(host_server)])
    view = unsandboxed.wait_state(task["id"], "done", "failed")
    seen = results(unsandboxed, view["id"])
    assert view["state"] == "done", (view, seen)
    assert view["isolation"] == "not sandboxed: the sandbox is turned off (BOX_SANDBOX=off); proxy environment variables only"
    events = unsandboxed.events(view["id"])
    first_after_start = [e for e in events if e["seq"] > 2][0]
    assert first_after_start["kind"] == "note" and first_after_start["summary"].startswith("isolation: not sandboxed")
    assert seen["uid"] == str(os.getuid())  # the box's own user: nothing pretends otherwise
    assert seen["proxy"].startswith("http://127.0.0.1:")
    assert seen["listed"] == "ok 200" and seen["not_listed"] == "refused 403"
    blocked = [e["data"] for e in events if e["kind"] == "blocked_connection"]
    assert [(b["host"], b["port"]) for b in blocked] == [("not-listed.example", 80)]
