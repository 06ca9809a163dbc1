"""From inside a task: who it runs as, what it can touch, and what it cannot."""
from __future__ import annotations

import os
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from tasks.broker.paths import client_dir
from tasks.layers import disk
from tasks.sandbox.paths import runtime_dir
from tasks.vault.crypto import fernet
from tests.conftest import wait_for
from tests.factories import flow
from tests.sandbox.conftest import data_dir_where_a_box_keeps_it, needs_sandbox, results, run_script

pytestmark = needs_sandbox

WHO_AM_I = textwrap.dedent("""
    import os
    print("uid=%d" % os.getuid())
    print("euid=%d" % os.geteuid())
    print("groups=%s" % ",".join(map(str, os.getgroups())))
    print("nnp=" + [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")][0])
    print("pids=%d" % len([p for p in os.listdir("/proc") if p.isdigit()]))
    print("ppid=%d" % os.getppid())
    print("sid_is_self=%s" % (os.getsid(0) == os.getpid()))
    print("netns=" + os.readlink("/proc/self/ns/net"))
    print("cwd=" + os.getcwd())
    print("home=" + os.environ["HOME"])
    print("path=" + os.environ["PATH"])
    import socket
    print("ifaces=" + ",".join(sorted(name for _, name in socket.if_nameindex())))
    print("sysfs=" + ",".join(sorted(os.listdir("/sys/class/net"))))
    try:
        open("/dev/tty")
        print("tty=yes")
    except OSError as exc:
        print("tty=no")
""")


def test_a_task_runs_as_its_own_user_in_new_namespaces_and_says_so(sandboxed):
    view = run_script(sandboxed, WHO_AM_I)
    assert view["state"] == "done", view
    seen = results(sandboxed, view["id"])
    assert seen["uid"] == seen["euid"] != "0"
    assert seen["groups"] == ""
    assert seen["nnp"] == "1"
    assert int(seen["pids"]) <= 3 and seen["ppid"] == "1"  # PID 1 is the sandbox's init; nothing of the host
    assert seen["sid_is_self"] == "True" and seen["tty"] == "no"
    assert seen["netns"] != os.readlink("/proc/self/ns/net")
    assert seen["ifaces"] == seen["sysfs"] == "lo"
    assert seen["cwd"] == seen["home"] and seen["cwd"].endswith(f"/run/{view['id']}/view")
    assert seen["path"].startswith(f"{client_dir()}:")  # the box client of this version comes first
    assert view["user"] == f"box-{view['id']}"
    assert view["isolation"].startswith("sandboxed as box-")
    notes = [e for e in sandboxed.events(view["id"]) if e["kind"] == "note" and e["summary"].startswith("isolation:")]
    assert notes and notes[0]["data"]["isolation"]["sandbox"] is True
    first_after_start = [e for e in sandboxed.events(view["id"]) if e["seq"] > 2][0]
    assert first_after_start["summary"].startswith("isolation:")


def test_a_flow_run_step_can_change_its_own_files_and_nothing_else(sandboxed):
    home = sandboxed.home
    (home / "a.txt").write_text("base\n")
    (home / "sub").mkdir()
    (home / "sub" / "b.txt").write_text("b\n")
    view = sandboxed.create(title="edits", flow=flow(
        {"run": "echo more >> a.txt && echo new > sub/c.txt && rm sub/b.txt && mkdir d && echo x > d/e.txt"},
        {"run": "cat a.txt && ls -ln a.txt", "save": "listing"},
    ))
    done = sandboxed.wait_state(view["id"], "done", "failed")
    assert done["state"] == "done", done
    assert (home / "a.txt").read_text() == "base\n" and (home / "sub" / "b.txt").exists()
    assert not (home / "d").exists() and not (home / "sub" / "c.txt").exists()


ESCAPES = textwrap.dedent("""
    import os, sys
    base, other = sys.argv[1], sys.argv[2]
    def attempt(name, path, content="escaped"):
        try:
            with open(path, "w") as handle:
                handle.write(content)
            print(name + "=written")
        except OSError as exc:
            print(name + "=denied " + exc.strerror)
    attempt("parent", "../escape.txt")
    attempt("parent2", "../../escape.txt")
    attempt("etc", "/etc/box-escape.txt")
    attempt("root", "/root/box-escape.txt")
    attempt("base", os.path.join(base, "escape.txt"))
    attempt("base_existing", os.path.join(base, "keep.txt"))
    attempt("other_task", other)
    attempt("link_etc", "planted-etc/box-escape.txt")
    attempt("link_root", "planted-root/box-escape.txt")
    attempt("link_file", "planted-passwd")
    attempt("tmp", "/tmp/box-sandbox-escape.txt")
    attempt("inside", "inside.txt", "mine")
    for name in ("planted-root", "/root"):
        try:
            os.listdir(name)
            print("list_" + name.strip("/").replace("-", "_") + "=listed")
        except OSError as exc:
            print("list_" + name.strip("/").replace("-", "_") + "=denied")
""")


def test_writes_outside_the_view_fail_and_leave_the_workspace_untouched(sandboxed, tmp_path):
    home = sandboxed.home
    (home / "keep.txt").write_text("original\n")
    (home / "planted-etc").symlink_to("/etc")
    (home / "planted-root").symlink_to("/root")
    (home / "planted-passwd").symlink_to("/etc/passwd")
    other = tmp_path / "other-task-file.txt"
    other.write_text("another task's\n")
    os.chmod(other, 0o666)  # even a world-writable file of the host is not reachable by path
    before = _snapshot(home)

    task = sandboxed.create(title="escape", prompt="p", worker="command",
                            command=["/usr/bin/python3", "-c", ESCAPES, str(home), str(other)])
    view = sandboxed.wait_state(task["id"], "done", "failed")
    seen = results(sandboxed, view["id"])
    assert view["state"] == "done", (view, seen)
    for name in ("parent", "parent2", "etc", "root", "base", "base_existing", "other_task", "link_etc", "link_root", "link_file"):
        assert seen[name].startswith("denied"), (name, seen[name])
    assert seen["list_planted_root"] == "denied" and seen["list_root"] == "denied"
    assert seen["inside"] == "written"
    assert seen["tmp"] == "written"  # its own private /tmp, gone with it
    assert not Path("/tmp/box-sandbox-escape.txt").exists()
    assert not Path("/etc/box-escape.txt").exists() and not Path("/root/box-escape.txt").exists()
    assert b"escaped" not in Path("/etc/passwd").read_bytes()  # other tests add users meanwhile; nothing of ours
    assert other.read_text() == "another task's\n"
    assert _snapshot(home) == before


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        content = os.readlink(path) if path.is_symlink() else (path.read_text() if path.is_file() else "")
        found[str(path.relative_to(root))] = (stat.S_IMODE(st.st_mode), content)
    return found


PRIVILEGE = textwrap.dedent("""
    import fcntl, os, subprocess, sys, termios
    def tiocsti(fd_source):
        try:
            fd = fd_source()
            fcntl.ioctl(fd, termios.TIOCSTI, b"x")
            return "injected"
        except OSError as exc:
            return "denied " + exc.strerror
    print("tiocsti_stdin=" + tiocsti(lambda: 0))
    print("tiocsti_tty=" + tiocsti(lambda: os.open("/dev/tty", os.O_RDWR)))
    su = subprocess.run(["su", "root", "-c", "id -u"], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    print("su=%d %s" % (su.returncode, su.stdout.strip()))
    print("suid_copy=" + subprocess.run([sys.argv[1], "-u"], capture_output=True, text=True).stdout.strip())
    try:
        os.setuid(0)
        print("setuid=root")
    except OSError as exc:
        print("setuid=denied")
""")


def test_no_keystroke_injection_and_no_way_to_root(sandboxed, tmp_path):
    # A setuid-root copy of `id`, where the task can run it: with no_new_privs it stays the task.
    suid_dir = Path("/usr/local/lib/box-sandbox-test")
    suid_dir.mkdir(parents=True, exist_ok=True)
    suid_id = suid_dir / f"id-{os.getpid()}"
    try:
        suid_id.write_bytes(Path("/usr/bin/id").read_bytes())
        os.chmod(suid_id, 0o4755)
        assert subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", str(suid_id), "-u"],
                              capture_output=True, text=True).stdout.strip() == "0"  # the copy does work outside
        task = sandboxed.create(title="root?", prompt="p", worker="command",
                                command=["/usr/bin/python3", "-c", PRIVILEGE, str(suid_id)])
        view = sandboxed.wait_state(task["id"], "done", "failed")
    finally:
        suid_id.unlink(missing_ok=True)
        if not any(suid_dir.iterdir()):
            suid_dir.rmdir()
    seen = results(sandboxed, view["id"])
    assert view["state"] == "done", (view, seen)
    assert seen["tiocsti_stdin"].startswith("denied") and seen["tiocsti_tty"].startswith("denied")
    assert not seen["su"].startswith("0 ") and seen["su"].split(" ")[-1] != "0"
    assert seen["suid_copy"] not in ("0", "")
    assert seen["setuid"] == "denied"


def test_the_box_data_and_other_tasks_are_unreadable(sandboxed, settings, tmp_path):
    with data_dir_where_a_box_keeps_it(settings, "data") as data:
        fernet()  # the vault key exists
        (data / "box.sqlite3").write_text("SQLite format 3 (a stand-in database file)")
        first = sandboxed.create(title="secret keeper", flow=flow({"write": {"path": "secret.txt", "content": "s3cret"}}))
        assert sandboxed.wait_state(first["id"], "done")["state"] == "done"
        # the task's release moves its layer out of its image in the background; os.walk skips the
        # image's mount point if it goes meanwhile
        wait_for(lambda: not disk.image_path(first["id"]).exists(), timeout=30, what="the first task's layer settled")
        layer_files = [Path(where, name) for where, _, names in os.walk(data) for name in names if name == "secret.txt"]
        assert layer_files, "the first task's file is somewhere in the data directory"
        probe = textwrap.dedent("""
            import os, sys
            for index, path in enumerate(sys.argv[1:]):
                try:
                    if os.path.isdir(path):
                        os.listdir(path)
                    else:
                        open(path, "rb").read()
                    print("read%d=read %s" % (index, path))
                except OSError as exc:
                    print("read%d=denied %s" % (index, exc.strerror))
        """)
        targets = [str(data / "vault.key"), str(data / "box.sqlite3"), str(data), str(data / "tasks"),
                   *map(str, layer_files), str(runtime_dir(first["id"])), str(data / "django-secret-key")]
        task = sandboxed.create(title="thief", prompt="p", worker="command", command=["/usr/bin/python3", "-c", probe, *targets])
        view = sandboxed.wait_state(task["id"], "done", "failed")
        seen = results(sandboxed, view["id"])
        assert view["state"] == "done", (view, seen)
        assert len(seen) == len(targets)
        for name, value in seen.items():
            assert value.startswith("denied"), (name, value)
        assert (data / "vault.key").stat().st_mode & 0o077 == 0
        assert (data / "box.sqlite3").stat().st_mode & 0o077 == 0
        assert data.stat().st_mode & 0o777 == 0o711


@pytest.mark.parametrize("command", [
    "echo escaped > ../escape.txt",
    "echo escaped > /etc/box-flow-escape.txt",
    "echo escaped > planted/box-flow-escape.txt",
    "cat /root/.bashrc /etc/shadow",
])
def test_a_flow_run_step_that_reaches_outside_fails(sandboxed, command):
    (sandboxed.home / "planted").symlink_to("/etc")
    task = sandboxed.create(title="flow escape", flow=flow({"run": command}))
    view = sandboxed.wait_state(task["id"], "done", "failed")
    refusals = ("Permission denied", "Read-only file system", "No such file or directory", "Directory nonexistent")
    assert view["state"] == "failed" and any(r in view["error"] for r in refusals), view["error"]
    assert not Path("/etc/box-flow-escape.txt").exists()
    assert sorted(p.name for p in sandboxed.home.iterdir()) == ["planted"]
