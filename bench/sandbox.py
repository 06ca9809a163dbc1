"""A sandboxed process start beside its floors: a bare ``unshare`` and a bare ``useradd``.

Measures, on this machine, N times each:
  plain start          Popen(/bin/true) in its own session (what runs without the sandbox)
  bare unshare         unshare --pid --fork --net --mount --ipc --uts --mount-proc /bin/true
  bare useradd/userdel the account tools alone
  unshare + python     a bare unshare running a system python3 that starts /bin/true: the floor of
                       a sandboxed command with an init of its own
  sandboxed start      tasks.sandbox.launcher.popen(/bin/true) + wait, the task's user existing
                       (every step after the first): namespaces, id-mapped view, init (its own
                       root, fresh keyrings, the seccomp filter, the task's control group), setuid
  a run's next command the same through the run's resident init (tasks.sandbox.resident), as every
                       command of a run after its first starts (its init's own start not counted)
  first start          the same plus creating the task's user
  release              kill sweep, disown files, userdel (after a task ends)
  with hosts           a sandboxed start that also starts the egress proxy and forwarder

Each row gives wall-clock p50/p95 and the median CPU time spent (this process and its children):
on a shared machine the wall clock follows the load, the CPU time much less.

Needs root. Usage: .venv/bin/python bench/sandbox.py [-n 30]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(fn: Callable[[], object], n: int, also: Callable[[], float] = lambda: 0.0) -> tuple[list[float], list[float]]:
    """Wall-clock ms per call, and CPU ms per call (this process and every child it waited for:
    the launcher, unshare, init and the command; ``also``: CPU ms of a process still running, a
    run's resident init), which shared-machine load barely moves."""
    wall, cpu = [], []
    for _ in range(n):
        before = _cpu_ms() + also()
        start = time.perf_counter()
        fn()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append(_cpu_ms() + also() - before)
    return wall, cpu


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_ms(pid: int) -> float:
    """CPU ms of ``pid``'s children (a run's init under its ``unshare``), with what they waited for."""
    total = 0.0
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        fields = Path(f"/proc/{child}/stat").read_bytes().rsplit(b")", 1)[1].split()
        total += sum(int(f) for f in fields[11:15]) * 1000 / _TICK
    return total


def _cpu_ms() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime) * 1000


def row(name: str, samples: tuple[list[float], list[float]]) -> str:
    wall, cpu = samples
    ordered = sorted(wall)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"| {name:<36} | {statistics.median(wall):8.1f} | {p95:8.1f} | {statistics.median(cpu):8.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=30)
    n = parser.parse_args().n
    if os.geteuid() != 0:
        sys.exit("bench/sandbox.py needs root (it creates users and namespaces)")

    data = Path(tempfile.mkdtemp(prefix="box-bench-sandbox-", dir="/var/tmp"))
    os.environ.update({"BOX_DATA_DIR": str(data), "DJANGO_SETTINGS_MODULE": "boxsite.settings", "BOX_LOG_LEVEL": "WARNING"})
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from tasks.models import Task, Workspace
    from tasks.sandbox import cleanup, launcher, resident, users
    from tests.factories import make_owner

    owner = make_owner("bench")
    base = data / "base"
    base.mkdir()
    (base / "file.txt").write_text("x")
    workspace = Workspace.objects.create(name="bench", base_dir=str(base))
    work = data / "view"
    work.mkdir()

    def context(hosts: list[str]) -> SimpleNamespace:
        task = Task.objects.create(owner=owner, title="bench", workspace=workspace, worker="command", hosts=hosts,
                                   state="running")
        return SimpleNamespace(task=task, workdir=work, recorder=None, before_process=None, resident=None)

    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8"}

    def run_in(ctx: SimpleNamespace) -> None:
        proc = launcher.popen(ctx, ["/bin/true"], env=env, cwd=work)  # type: ignore[arg-type]
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            stream.read()
        assert proc.wait() == 0, proc.returncode

    warm = context([])
    users.ensure_user(warm.task.pk)
    run_in(warm)  # warm caches
    results = [row("plain start (no sandbox)", timed(lambda: subprocess.run(["/bin/true"], start_new_session=True, check=True), n))]
    results.append(row("bare unshare (pid,net,mount,ipc,uts)", timed(lambda: subprocess.run(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--mount", "--ipc", "--uts", "/bin/true"],
        check=True), n)))
    names = [f"box-bench{i:04d}" for i in range(n)]
    adds = iter(names)
    results.append(row("bare useradd", timed(lambda: subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", next(adds)], check=True), n)))
    dels = iter(names)
    results.append(row("bare userdel", timed(lambda: subprocess.run(["userdel", next(dels)], check=True), n)))
    results.append(row("bare unshare + python3 -I -S + /bin/true", timed(lambda: subprocess.run(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--mount", "--ipc", "--uts",
         "/usr/bin/python3", "-I", "-S", "-c", "import subprocess; subprocess.run(['/bin/true'])"], check=True), n)))
    results.append(row("sandboxed start (user exists)", timed(lambda: run_in(warm), n)))
    with resident.serving(warm):
        run_in(warm)  # the run's init starts with its first command
        init = warm.resident.init
        assert init is not None
        results.append(row("a run's next command (resident init)", timed(lambda: run_in(warm), n,
                                                                           lambda: tree_cpu_ms(init.proc.pid))))

    cold = [context([]) for _ in range(n)]
    queue = iter(cold)

    def first_start() -> None:
        ctx = next(queue)
        users.ensure_user(ctx.task.pk)
        run_in(ctx)

    results.append(row("first start (creates the user)", timed(first_start, n)))
    ended = iter(cold)
    results.append(row("release (kill sweep, userdel)", timed(lambda: cleanup.release(next(ended).task.pk), n)))
    with_hosts = context(["example.com"])
    users.ensure_user(with_hosts.task.pk)
    results.append(row("sandboxed start with hosts (proxy)", timed(lambda: run_in(with_hosts), n)))
    cleanup.release(warm.task.pk)
    cleanup.release(with_hosts.task.pk)
    subprocess.run(["rm", "-rf", str(data)], check=True)

    print(f"\nsandboxed process start vs its floors ({n} runs each, ms)\n")
    print(f"| {'what':<36} | {'p50':>8} | {'p95':>8} | {'cpu p50':>8} |")
    print(f"|{'-' * 38}|{'-' * 10}|{'-' * 10}|{'-' * 10}|")
    print("\n".join(results))


if __name__ == "__main__":
    main()
