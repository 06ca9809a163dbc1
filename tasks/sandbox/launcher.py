"""The single place a task's processes start and stop.

With the sandbox (root): every process runs as the task's user ``box-<id>``, as PID 1's child in
new PID, network, mount, IPC and UTS namespaces, in a new session with no controlling terminal,
with no_new_privs, in the task's view (mounted for it alone, id-mapped so the user owns its
files). Listed hosts are reachable only through the egress proxy, via the in-namespace forwarder.

Turned off by the owner (``BOX_SANDBOX=off``), a process runs as the box's user in its own session in the
task's directory, and listed hosts are offered through the proxy environment variables only:
a program that ignores them is not stopped. ``tasks.sandbox.isolation`` says so to the owner.
A box that cannot sandbox and was not told to go without starts nothing (``support.refusal``).
"""
from __future__ import annotations

import errno
import json
import os
import select
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from django.db import connection

from tasks.broker.paths import client_dir
from tasks.layers import disk
from tasks.models import EventKind, Task
from tasks.run.recorder import LeaseLost, LimitReached
from tasks.sandbox import accounts, cgroups, egress, idmap, paths, resident, support, users
from tasks.sandbox.cleanup import release
from tasks.states import FINAL

if TYPE_CHECKING:
    from tasks.models import Task
    from tasks.run.context import RunContext

FORWARD_PORT = 3128  # inside the task's own network namespace, so every task can use it
MAX_PROCESSES = 1024  # per task user: a fork bomb stops here
# Every task process is started through this: it gets SIGKILL when the worker thread that started
# it dies (even by SIGKILL), so a lost worker's step cannot run on unsupervised and then run twice.
DIE_WITH_WORKER = ["setpriv", "--pdeathsig", "KILL", "--"]
NO_PROXY = "localhost,127.0.0.1,::1"


PROFILE_MOUNT = "/run/box-profile"  # where ``popen(profile=...)`` shows a folder inside the sandbox


@dataclass(frozen=True)
class Keep:
    """A process's receipt (``tasks.run.receipts``): the file its ending is appended to, and the
    two spool files its whole stdout and stderr go to (at most ``limit`` + 1 bytes each).
    ``hold``: a test's, init waits for the worker to die before it writes the ending."""

    ending: Path
    spool: tuple[Path, Path]
    limit: int
    hold: bool = False


def keeps_receipts() -> bool:
    """Whether the sandbox's init writes a kept process's spool and ending (``popen(keep=...)``);
    otherwise the worker does, and a worker killed after the process's exit loses its ending."""
    return support.available()


def popen(ctx: RunContext, argv: list[str], *, env: dict[str, str], cwd: Path,
          script: str | None = None, profile: Path | None = None, keep: Keep | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` for the task. ``OSError`` when the executable does not exist.

    With ``script``, ``argv`` gets one more argument: the path of a file only the process can
    open (a memfd) holding ``script`` (``["/bin/sh"]`` runs a shell script). Anything secret goes
    there, never into ``argv``: every process's command line is world-readable in /proc.
    With ``profile`` (a folder of the owner's, a browser profile) the sandboxed process sees it
    at ``PROFILE_MOUNT``, id-mapped so the task's user owns it (files stay root's on disk).
    With ``keep`` and the sandbox (``keeps_receipts``), its init fills the receipt's files.
    """
    if not argv:
        raise FileNotFoundError(errno.ENOENT, "no command given")
    if ctx.before_process is not None:
        ctx.before_process()  # the run's broker, there before the process can call it
    found = support.standing()
    if found.sandboxed:
        return _popen_sandboxed(ctx, argv, env=env, cwd=cwd, script=script, profile=profile, keep=keep)
    if found.mode != "off":  # never unsandboxed unless the owner said so (the run's start refuses first)
        raise accounts.SandboxError(support.refusal() or found.summary)
    return _popen_plain(ctx, argv, env=env, cwd=cwd, script=script)


def kill(proc: subprocess.Popen[bytes] | resident.Command) -> None:
    """Stop a process started here and everything it started (its whole PID namespace)."""
    if isinstance(proc, resident.Command):
        proc.kill()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _popen_plain(ctx: RunContext, argv: list[str], *, env: dict[str, str], cwd: Path,
                 script: str | None) -> subprocess.Popen[bytes]:
    # setpriv would only report a missing program as exit 127: say it before starting, as exec would.
    _require_executable(argv[0], env.get("PATH", os.defpath), cwd)
    env = dict(env)
    proxy = None
    if ctx.task.hosts:
        proxy = egress.acquire(ctx.task.pk, lambda: _tcp_proxy(ctx))
        env.update(_proxy_env(f"http://127.0.0.1:{proxy.port}"))
    script_fd = -1
    try:
        if script is not None:
            script_fd = _script_file(script)
            argv = [*argv, f"/proc/self/fd/{script_fd}"]
        proc = subprocess.Popen([*DIE_WITH_WORKER, *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                pass_fds=(script_fd,) if script_fd >= 0 else ())
    except BaseException:
        if proxy is not None:
            egress.release(ctx.task.pk)
        raise
    finally:
        if script_fd >= 0:
            os.close(script_fd)
    if proxy is not None:
        _release_proxy_on_exit(proc, ctx.task.pk)
    return proc


def _popen_sandboxed(ctx: RunContext, argv: list[str], *, env: dict[str, str], cwd: Path,
                     script: str | None, profile: Path | None = None, keep: Keep | None = None) -> subprocess.Popen[bytes]:
    task = ctx.task
    slot: resident.Slot | None = getattr(ctx, "resident", None)
    # The run's init is up: its user is claimed, the data directory hardened and the runtime
    # directory made (the init's root holds it), for the whole run.
    ident: accounts.Identity | None = slot.ident if slot is not None and slot.init is not None and slot.init.alive() else None
    if ident is not None:
        runtime = paths.runtime_dir(task.pk)
    else:
        ident = users.ensure_user(task.pk)
        paths.harden_data_dir()
        runtime = paths.ensure_runtime_dir(task.pk, ident.uid, ident.gid)
    users.mark_ran(ident)  # before anything runs as the user: its release sweeps processes and keys
    view = paths.view_mount(task.pk)
    inner_cwd = _inside_view(ctx.workdir, cwd, view)
    search = f"{client_dir()}:{paths.SANDBOX_PATH}"  # the `box` client of this box first
    _require_executable(argv[0], search, cwd)  # cwd: the view as the box sees it

    env = dict(env)
    if env.get("HOME") == str(ctx.workdir):
        env["HOME"] = str(view)
    elif env.get("HOME") == str(paths.private_home(task.pk)):
        paths.ensure_private_home(task.pk, ident.uid, ident.gid)
    # Inside its root the task's user is named after the task (its own /etc/passwd); on the host
    # the uid belongs to a user of the box's pool, claimed by this task alone until its release.
    name = task.user or f"{accounts.PREFIX}{task.pk}"
    env.update({"PATH": search, "TMPDIR": "/tmp", "USER": name, "LOGNAME": name})
    env.setdefault("BOX_BROKER_SOCKET", str(paths.broker_socket(task.pk)))
    if task.hosts:
        env.update(_proxy_env(f"http://127.0.0.1:{FORWARD_PORT}"))
    # A command with a receipt (a run step, an agent's command, the command worker's process) is
    # forked by the run's resident init; anything else (a browser, long-lived and joined from
    # outside by its pid) gets an init of its own.
    if slot is not None and keep is not None and profile is None:
        forked = _run_resident(ctx, slot, ident, argv, env=env, cwd=inner_cwd, script=script, keep=keep,
                               runtime=runtime, view=view)
        if _has_ended(task.pk):  # as below: a cancel from another process while it started
            kill(forked)
            users.mark_ran(ident)
            release(task.pk)
        # What the box uses of a Popen (its streams, pid, poll, wait, kill), a Command has.
        return cast("subprocess.Popen[bytes]", forked)
    forward = None
    if task.hosts:
        socket_path = paths.egress_socket(task.pk)
        egress.acquire(task.pk, lambda: _unix_proxy(ctx, socket_path, ident))
        forward = {"port": FORWARD_PORT, "socket": str(socket_path)}

    view_fd = config_read = config_write = profile_fd = -1
    kept: list[int] = []  # the receipt's files, opened here (root's): init writes them, the task never sees them
    try:
        groups = cgroups.prepare(task.pk, cgroups.Limits(memory_mb=_limit(task, "memory_mb"),
                                                         cpu_percent=_limit(task, "cpu_percent")))
        view_fd = _view_tree(ctx.workdir, ident)
        if profile is not None:
            st = os.stat(profile)
            profile_fd = idmap.clone_tree(profile, uid=ident.uid, gid=ident.gid, disk_uid=st.st_uid, disk_gid=st.st_gid)
        config = {
            "uid": ident.uid, "gid": ident.gid, "nproc": MAX_PROCESSES,
            "user": name, "view_fd": view_fd, "view": str(view), "runtime": str(runtime),
            "cwd": str(inner_cwd), "argv": argv, "script": script, "forward": forward,
            "cgroups": groups,
            "profile_fd": profile_fd if profile_fd >= 0 else None, "profile": PROFILE_MOUNT,
        }
        if keep is not None:
            kept.append(os.open(keep.ending, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC))  # its header is there
            kept.extend(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600) for path in keep.spool)
            config["keep"] = {"ending": kept[0], "spool": kept[1:], "limit": keep.limit, "hold": keep.hold}
        # The configuration (the command, a script with secret facts substituted in) reaches
        # init through a pipe: init's own command line, like every one in /proc, is world-readable.
        config_read, config_write = os.pipe()
        # unshare dies with the worker; --kill-child takes init, and so the whole PID namespace, with it.
        command = [*DIE_WITH_WORKER, "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--mount",
                   "--ipc", "--uts", "--propagation", "private", "--", str(support.SYSTEM_PYTHON), "-I", "-S", str(support.INIT), str(config_read)]
        passed = (view_fd, config_read, *((profile_fd,) if profile_fd >= 0 else ()), *kept)
        proc = subprocess.Popen(command, cwd="/", env=env, pass_fds=passed, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        os.close(config_read)
        config_read = -1
        _send_config(config_write, config)
        config_write = -1
    except BaseException:
        if forward is not None:
            egress.release(task.pk)
        raise
    finally:
        for fd in (view_fd, config_read, config_write, profile_fd, *kept):
            if fd >= 0:
                os.close(fd)
    if forward is not None:
        _release_proxy_on_exit(proc, task.pk)
    if _has_ended(task.pk):
        # The task ended while this process was starting (a cancel from another process): its
        # release may have run before the user existed again, so undo what this start made.
        kill(proc)
        users.mark_ran(ident)  # a release that ran meanwhile cleared the mark before this process started
        release(task.pk)
    return proc


def _run_resident(ctx: RunContext, slot: resident.Slot, ident: accounts.Identity, argv: list[str], *, env: dict[str, str],
                  cwd: Path, script: str | None, keep: Keep | None, runtime: Path, view: Path) -> resident.Command:
    """Start the command through the run's resident init (``tasks.sandbox.resident``), starting
    that first when the run has none yet (or it died)."""
    name = env["USER"]
    if slot.init is None or not slot.init.alive():
        if slot.init is not None:
            slot.init.close()
            slot.init = None
        slot.init = _start_resident(ctx, slot, ident, name, runtime=runtime, view=view)
        slot.ident = ident
    config: dict[str, object] = {"uid": ident.uid, "gid": ident.gid, "nproc": MAX_PROCESSES, "user": name,
                                 "runtime": str(runtime), "cwd": str(cwd), "argv": argv,
                                 "script": script, "env": env}
    kept: list[int] = []
    try:
        if keep is not None:
            kept.append(os.open(keep.ending, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC))  # its header is there
            kept.extend(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600) for path in keep.spool)
            config["keep"] = {"limit": keep.limit, "hold": keep.hold}
        return slot.init.run(argv, config, kept)
    finally:
        for fd in kept:
            os.close(fd)


def _start_resident(ctx: RunContext, slot: resident.Slot, ident: accounts.Identity, name: str, *, runtime: Path,
                    view: Path) -> resident.ResidentInit:
    """The run's init: its namespaces, root, view and control groups, made once for its commands."""
    task = ctx.task
    view_fd = -1
    forward = None
    if task.hosts:
        socket_path = paths.egress_socket(task.pk)
        egress.acquire(task.pk, lambda: _unix_proxy(ctx, socket_path, ident))
        slot.on_close.append(lambda: egress.release(task.pk))
        forward = {"port": FORWARD_PORT, "socket": str(socket_path)}
    try:
        groups = cgroups.prepare(task.pk, cgroups.Limits(memory_mb=_limit(task, "memory_mb"),
                                                         cpu_percent=_limit(task, "cpu_percent")))
        view_fd = _view_tree(ctx.workdir, ident)
        config = {"uid": ident.uid, "gid": ident.gid, "nproc": MAX_PROCESSES, "user": name, "view_fd": view_fd,
                  "view": str(view), "runtime": str(runtime),
                  "forward": forward, "cgroups": groups, "profile_fd": None, "profile": PROFILE_MOUNT}
        return resident.ResidentInit.start(config, (view_fd,))
    finally:
        if view_fd >= 0:
            os.close(view_fd)


def check_limits(ctx: RunContext) -> None:
    """``LimitReached`` when the kernel stopped the task at one of its resource limits."""
    if not support.available():
        return
    if cgroups.memory_exhausted(ctx.task.pk):
        limit = _limit(ctx.task, "memory_mb")
        raise LimitReached("memory_mb", f"memory limit of {size_text(limit)} reached",
                           f"raise limits.memory_mb above {limit} and retry the task")
    disk_mb = ctx.task.limit("disk_mb")
    if disk_mb is not None and disk.reached(ctx.task.pk, disk_mb):
        raise LimitReached("disk_mb", f"disk limit of {size_text(disk_mb)} reached",
                           f"raise limits.disk_mb above {disk_mb} and retry the task")


def size_text(megabytes: int) -> str:
    return f"{megabytes // 1024} GB" if megabytes % 1024 == 0 else f"{megabytes} MB"


def _limit(task: Task, name: str) -> int:
    value = task.limit(name)
    if value is None:
        raise accounts.SandboxError(f"the task has no {name} limit", field=f"limits.{name}")
    return value


def _send_config(fd: int, config: dict[str, object]) -> None:
    """Write ``config`` to init's pipe and close it (init reads to the end before anything else)."""
    with open(fd, "wb") as pipe:
        try:
            pipe.write(json.dumps(config).encode())
        except BrokenPipeError:
            pass  # init died before reading; its exit status and stderr say why


def _script_file(script: str) -> int:
    """A memfd holding ``script``, inheritable, for a process started here to read by path."""
    fd = os.memfd_create("box-script", 0)
    os.write(fd, script.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _has_ended(task_id: str) -> bool:
    return Task.objects.filter(pk=task_id, state__in=FINAL).exists()


def _view_tree(workdir: Path, ident: accounts.Identity) -> int:
    """A detached mount of the view that the task's user owns.

    A view whose root the user already owns (a layer driver handed it over) is bound as it is.
    Otherwise it is id-mapped: its owner's files appear as the user's. Overlayfs cannot be
    id-mapped; then only the root directory is handed over, so the task can add and replace
    files but not edit ones other layers own (a driver avoids this by id-mapping its lowers).
    """
    st = os.stat(workdir)
    if st.st_uid == ident.uid:
        return idmap.clone_tree(workdir)
    try:
        return idmap.clone_tree(workdir, uid=ident.uid, gid=ident.gid, disk_uid=st.st_uid, disk_gid=st.st_gid)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    os.chown(workdir, ident.uid, ident.gid)
    return idmap.clone_tree(workdir)


def _inside_view(workdir: Path, cwd: Path, view: Path) -> Path:
    try:
        relative = Path(cwd).resolve().relative_to(Path(workdir).resolve())
    except ValueError as exc:
        raise accounts.SandboxError(f"a task's process must start inside its view, not in {cwd}", field="cwd") from exc
    return view / relative


def _require_executable(name: str, search_path: str, cwd: Path) -> None:
    """Inside the sandbox a missing program would only show as exit 127; say it before starting,
    the way a plain exec would. A program with a slash is found from the task's own directory
    (``./agent.sh`` in its view), never the box's; a file that is there but cannot run is
    "not executable", not "missing"."""
    if "/" in name:
        path = Path(cwd) / name  # an absolute name stays itself
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
        if not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, "not executable", name)
    elif shutil.which(name, path=search_path) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def _proxy_env(url: str) -> dict[str, str]:
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
            "NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY}


def _on_blocked(ctx: RunContext) -> egress.OnBlocked:
    def record(host: str, port: int, reason: str) -> None:

        try:
            ctx.recorder.event(EventKind.BLOCKED_CONNECTION, f"blocked {host}:{port}: {reason}",
                               {"host": host, "port": port, "reason": reason, "via": "egress proxy"})
        except LeaseLost:
            pass  # the run is over; its processes are being stopped anyway
        finally:
            connection.close()  # this thread's own connection; threads here are short-lived

    return record


def _unix_proxy(ctx: RunContext, socket_path: Path, ident: accounts.Identity) -> egress.EgressProxy:
    proxy = egress.EgressProxy(ctx.task.pk, ctx.task.hosts, _on_blocked(ctx))
    proxy.start_unix(socket_path, ident.uid, ident.gid)
    return proxy


def _tcp_proxy(ctx: RunContext) -> egress.EgressProxy:
    proxy = egress.EgressProxy(ctx.task.pk, ctx.task.hosts, _on_blocked(ctx))
    proxy.start_tcp()
    return proxy


def _release_proxy_on_exit(proc: subprocess.Popen[bytes], task_id: str) -> None:
    """Stop the task's proxy (when no other process of it uses it) once ``proc`` exits.

    Watches a pidfd, so it never reaps the process out from under ``process.wait``.
    """

    def watch() -> None:
        try:
            fd = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            egress.release(task_id)
            return
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
        egress.release(task_id)

    threading.Thread(target=watch, name=f"egress-watch-{task_id}", daemon=True).start()
