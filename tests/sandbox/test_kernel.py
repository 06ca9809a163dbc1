"""Attacks on the kernel's shared state from inside a task: the process list, keyrings, the host's
files and mount table, system calls. Each test performs the attack and fails if it succeeds."""
from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import threading
from pathlib import Path

from tasks.models import Task, Workspace
from tasks.sandbox import accounts, cleanup, users
from tasks.sandbox.paths import runtime_root
from tests.conftest import wait_for
from tests.factories import flow
from tests.pauses.helpers import cont, report
from tests.sandbox.conftest import needs_sandbox, results, run_script

pytestmark = needs_sandbox

SECRET = "hunter2-cmdline-canary-5150"
MARKER = "1000987"  # sleep's argument: how the test finds the running step


def _cmdlines() -> dict[int, bytes]:
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
    return found


def test_a_secret_in_a_run_step_is_in_no_process_command_line(sandboxed):
    seen: dict[str, object] = {}

    def watch() -> None:
        # While the step runs (its sleep is up only if the secret reached the script intact),
        # read every command line on the machine, then end the step.
        def step_running() -> int | None:
            return next((pid for pid, line in _cmdlines().items() if line == f"sleep\0{MARKER}\0".encode()), None)

        pid = wait_for(step_running, timeout=60, what="the run step's sleep")
        seen["leaks"] = [line for line in _cmdlines().values() if SECRET.encode() in line]
        seen["scanned"] = True
        os.kill(pid, signal.SIGKILL)

    watcher = threading.Thread(target=watch)
    watcher.start()
    task = sandboxed.create(title="secret step", facts={"password": SECRET}, flow=flow(
        {"run": f'test "${{password}}" = "{SECRET}" && exec sleep {MARKER}'},
    ))
    watcher.join(timeout=90)
    sandboxed.wait_state(task["id"], "failed", "done")
    assert seen.get("scanned"), "the step never ran with the secret"
    assert seen["leaks"] == []


def test_a_run_step_still_runs_its_shell_script(sandboxed):
    task = sandboxed.create(title="script", facts={"password": SECRET}, flow=flow(
        {"run": f'set -e\nx="${{password}}"\ncd /tmp && printf %s "$x" > got\ntest "$(cat got)" = "{SECRET}"'},
    ))
    view = sandboxed.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view


def _as_user(uid: int, gid: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv],
                          capture_output=True, text=True, check=False)


def _plant_key(uid: int, gid: int, description: str) -> str:
    planted = _as_user(uid, gid, "keyctl", "add", "user", description, "earlier-task-secret", "@u")
    assert planted.returncode == 0, planted.stderr
    return planted.stdout.strip()


def _keys_of(ident: accounts.Identity) -> str:
    """Every key the uid can see (/proc/keys lists those it may view), as that uid sees them."""
    return _as_user(ident.uid, ident.gid, "cat", "/proc/keys").stdout


def test_a_task_finds_nothing_in_its_uids_keyrings_and_release_empties_them(sandboxed):
    # A key sits in the uid's user keyring when a step starts, as an earlier task with the same
    # (recycled) uid would have left it: the step must neither see nor read it.
    task = sandboxed.create(title="keyrings", flow=flow(
        {"run": "cat /proc/keys; keyctl print ${key serial} 2>&1; keyctl show @u 2>&1; keyctl show @s 2>&1",
         "save": "seen"},
        {"run": "keyctl add user mine task-secret @s >/dev/null && keyctl print %user:mine", "save": "own"},
    ))
    assert sandboxed.wait_state(task["id"], "waiting")["waitingFor"] == "input"  # the task's user exists now
    ident = users.find_user(task["id"])
    assert ident is not None
    serial = _plant_key(ident.uid, ident.gid, "box-keyring-canary")
    assert "box-keyring-canary" in _keys_of(ident)  # it is there
    assert cont(sandboxed, task["id"], inputs={"key serial": serial}).status_code == 200
    view = sandboxed.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view
    records = report(sandboxed, task["id"])["records"]
    assert "box-keyring-canary" not in records["seen"] and "earlier-task-secret" not in records["seen"]
    assert records["own"] == "task-secret"  # its own session keyring works
    # Released: the user is gone, and its uid's user keyring is empty for whoever gets it next.
    wait_for(lambda: users.find_user(task["id"]) is None, what="the task's user to be removed")
    wait_for(lambda: "box-keyring-canary" not in _keys_of(ident), what="the planted key to be gone")


def test_release_empties_the_user_keyring_a_task_left(sandboxed):
    task = Task.objects.create(owner=sandboxed.owner, title="left keys", prompt="p", worker="command", state="cancelled",
                               workspace=Workspace.objects.get(name="home"))
    ident = users.ensure_user(task.pk)
    users.mark_ran(ident)  # as the launcher does before it starts a process (which could add keys) as the user
    _plant_key(ident.uid, ident.gid, "box-left-behind")
    assert "box-left-behind" in _keys_of(ident)
    cleanup.release(task.pk)
    wait_for(lambda: "box-left-behind" not in _keys_of(ident), what="the key left behind to be gone")


SYSCALLS = textwrap.dedent("""
    import ctypes, errno, os, subprocess
    libc = ctypes.CDLL(None, use_errno=True)
    def outcome(result):
        return "allowed" if result >= 0 else "denied " + errno.errorcode[ctypes.get_errno()]
    def run(*argv):
        done = subprocess.run(argv, capture_output=True, text=True)
        return "%d %s" % (done.returncode, (done.stdout + done.stderr).strip().replace(chr(10), " "))
    print("unshare_cmd=" + run("unshare", "-Ur", "id", "-u"))
    print("unshare_mount=" + run("unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /tmp && echo mounted"))
    print("unshare_user=" + outcome(libc.unshare(0x10000000)))
    print("mount=" + outcome(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.ptrace(0, 0, None, None) >= 0 else 1)  # PTRACE_TRACEME
    print("ptrace=" + ("allowed" if os.waitpid(pid, 0)[1] == 0 else "denied"))
    print("bpf=" + outcome(libc.syscall(321, 0, None, 0)))
    print("keyctl_user=" + run("keyctl", "add", "user", "k", "v", "@u"))
    print("keyctl_persistent=" + run("keyctl", "get_persistent", "@s"))
    print("keyctl_session=" + run("keyctl", "add", "user", "k", "v", "@s"))
    print("shell=" + run("sh", "-c", "echo ok | tr o O"))
""")


def test_a_task_cannot_make_user_namespaces_mount_trace_or_load_bpf(sandboxed):
    view = run_script(sandboxed, SYSCALLS)
    seen = results(sandboxed, view["id"])
    assert view["state"] == "done", (view, seen)
    assert not seen["unshare_cmd"].startswith("0") and not seen["unshare_cmd"].endswith(" 0"), seen["unshare_cmd"]
    assert "mounted" not in seen["unshare_mount"]
    assert seen["unshare_user"] == "denied EPERM"
    assert seen["mount"] == "denied EPERM"
    assert seen["ptrace"] == "denied"
    assert seen["bpf"] == "denied EPERM"
    assert not seen["keyctl_user"].startswith("0 ") and not seen["keyctl_persistent"].startswith("0 ")
    assert seen["keyctl_session"].startswith("0 ")  # its own session keyring is allowed
    assert seen["shell"] == "0 Ok"


HOST_VIEW = textwrap.dedent("""
    import os, subprocess, sys
    canary, runtime_root = sys.argv[1], sys.argv[2]
    def attempt(name, action):
        try:
            action()
            print(name + "=allowed")
        except OSError as exc:
            print(name + "=denied " + (exc.strerror or ""))
    attempt("canary", lambda: open(canary).read())
    attempt("canary_dir", lambda: os.listdir(os.path.dirname(canary)))
    attempt("other_tasks", lambda: os.listdir(runtime_root))
    for name in ("/root", "/home", "/work", "/srv", "/var/lib", "/etc/shadow"):
        attempt("host" + name.replace("/", "_"), lambda: os.listdir(name) if os.path.isdir(name) else open(name).read())
    mounts = open("/proc/self/mountinfo").read()
    print("mounts_mention_canary=%s" % (os.path.dirname(canary) in mounts))
    print("mounts=" + " ".join(sorted(line.split()[4] for line in mounts.splitlines())))
    attempt("write_usr", lambda: open("/usr/box-escape", "w"))
    attempt("write_root", lambda: open("/box-escape", "w"))
    print("etc_passwd=" + ",".join(sorted(line.split(":")[0] for line in open("/etc/passwd"))))
    print("whoami=" + subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip())
    print("sh=" + subprocess.run(["sh", "-c", "echo $((6 * 7)) | tr 4 x"], capture_output=True, text=True).stdout.strip())
    print("python=" + subprocess.run(["python3", "-c", "import json, ssl; print(json.dumps([1]))"], capture_output=True, text=True).stdout.strip())
    print("client=%d" % subprocess.run(["box", "step", "hello-from-the-new-root"]).returncode)
""")


def test_the_host_filesystem_other_tasks_and_mount_table_are_out_of_sight(sandboxed):
    folder = Path("/var/lib/box-canary-test") / f"host-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder.parent, 0o755)
    canary = folder / "canary.txt"
    canary.write_text("host-only canary\n")
    os.chmod(canary, 0o644)  # world-readable: only the task's root can hide it
    try:
        other = sandboxed.create(title="another task", flow=flow({"write": {"path": "x.txt", "content": "x"}}))
        sandboxed.wait_state(other["id"], "done")
        task = sandboxed.create(title="host view", prompt="p", worker="command",
                                command=["/usr/bin/python3", "-c", HOST_VIEW, str(canary), str(runtime_root())])
        view = sandboxed.wait_state(task["id"], "done", "failed")
    finally:
        subprocess.run(["rm", "-rf", str(folder.parent)], check=True)
    seen = results(sandboxed, view["id"])
    assert seen, (view, sandboxed.events(view["id"]))
    for name in ("canary", "canary_dir", "other_tasks", "host_root", "host_home", "host_work", "host_srv",
                 "host_var_lib", "host_etc_shadow", "write_usr", "write_root"):
        assert seen[name].startswith("denied"), (name, seen[name])
    assert seen["mounts_mention_canary"] == "False"
    allowed = ("/usr", "/dev", "/etc", "/tmp", "/var/tmp", "/run", "/proc", "/sys", str(runtime_root()))
    assert all(point == "/" or point.startswith(allowed) for point in seen["mounts"].split()), seen["mounts"]
    assert seen["etc_passwd"] == f"box-{view['id']},nobody,root"
    assert seen["whoami"] == f"box-{view['id']}"
    assert seen["sh"] == "x2" and seen["python"] == "[1]" and seen["client"] == "0"
    assert any("hello-from-the-new-root" in e["summary"] for e in sandboxed.events(view["id"]))
    assert view["state"] == "done", (view, seen)


FORGE_A_RECEIPT = textwrap.dedent("""
    import os
    try:
        os.listdir("/proc/1/fd")
        print("init_fds=open")
    except PermissionError:
        print("init_fds=denied")
    mine = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")]
    print("receipt_fds=" + str(sum(".spool" in target or "receipt" in target for target in mine)))
""")


def test_a_task_cannot_reach_the_receipt_init_writes_for_it(sandboxed):
    """Init holds the step's receipt (how the process ended, its output) open for writing: the
    command inherits none of it, and cannot reach init's descriptors through /proc."""
    view = run_script(sandboxed, FORGE_A_RECEIPT)
    assert view["state"] == "done", view
    found = results(sandboxed, view["id"])
    assert found == {"init_fds": "denied", "receipt_fds": "0"}, found
