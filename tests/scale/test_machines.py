"""Two machines for real: each workspace lives on one machine, its runs go there, a running
task's diff, its artifacts and the workspace's files are read by the machine that holds them, an
undo and an upload are made there whichever web process is asked, and a dead machine's workspaces move
(docs/internals/scaling.md). The machines are simulated on this host (``tests.scale.namespaces``):
separate network and mount namespaces, separate data directories, nothing shared but PostgreSQL,
Redis and the keys given to both by their environment."""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings as django_settings

from boxsite.core import procs
from tasks.models import Machine, Run, RunState, Workspace
from tests.cluster import MANAGE, spawn, stop
from tests.conftest import Box, database_env, wait_for
from tests.factories import flow
from tests.scale import namespaces
from tests.scale.namespaces import Machine as SimulatedMachine

pytestmark = pytest.mark.skipif(not (django_settings.DB_IS_POSTGRES and django_settings.REDIS_URL),
                                reason="several machines share PostgreSQL and Redis")

PORT = 8100
MACHINE_ENV = {"BOX_LEASE_SECONDS": "3", "BOX_HEARTBEAT_SECONDS": "0.5", "BOX_RETRY_BACKOFF_SECONDS": "0.2",
               "BOX_SCHEDULER_TICK_SECONDS": "0.2", "BOX_QUEUE_POLL_S": "0.05", "BOX_WORKERS": "1",
               "BOX_USER_POOL": "1", "BOX_BEAT_S": "0.5", "BOX_MACHINE_GONE_S": "6", "BOX_RESEND_S": "1",
               "BOX_TASK_DISK_MB": "64"}
RELEASE = ("import django; django.setup()\n"
           "from tasks.run import lifecycle\n"
           "lifecycle.release_host(); lifecycle.empty_spare_pool()\n")


def _through(url: str, host: str) -> str:
    """``url`` with its host replaced: a machine reaches the host's loopback through its relay."""
    parts = urlsplit(url)
    netloc = parts.netloc.replace(parts.hostname or "", host, 1)
    return parts._replace(netloc=netloc).geturl()


class Api:
    """The owner's API at one machine's web process."""

    def __init__(self, machine: SimulatedMachine, token: str) -> None:
        self.base, self.token = f"http://{machine.address}:{PORT}", token

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as answer:
            return answer.code, json.loads(answer.read() or b"null")

    def raw(self, method: str, path: str, data: bytes | None = None) -> tuple[int, bytes]:
        """The bytes of an answer (a file, an artifact), or of a body sent as they are (an upload)."""
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/octet-stream"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as answer:
            return answer.code, answer.read()

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, found = self.call(method, path, body)
        assert status < 300, (method, path, status, found)
        return found

    def answers(self) -> bool:
        try:
            return self.call("GET", "/api/health")[0] == 200
        except OSError:
            return False

    def state(self, task_id: str) -> str:
        return str(self.ok("GET", f"/api/tasks/{task_id}")["state"])


@contextmanager
def started(tmp_path: Path, names: list[str]) -> Iterator[tuple[dict[str, SimulatedMachine], dict[str, dict[str, subprocess.Popen[bytes]]]]]:
    base = database_env()
    ports = [urlsplit(base["DATABASE_URL"]).port or 5432, urlsplit(base["REDIS_URL"]).port or 6379]
    shared = {"DJANGO_SECRET_KEY": django_settings.SECRET_KEY, "BOX_SECRET_KEY": Fernet.generate_key().decode(),
              "BOX_MACHINE_SECRET": secrets.token_urlsafe(32), "BOX_WEBPUSH_VAPID_KEY": _vapid_key()}
    running: dict[str, dict[str, subprocess.Popen[bytes]]] = {}
    envs: dict[str, dict[str, str]] = {}
    with namespaces.machines(tmp_path, names, ports) as found:
        try:
            for name, machine in found.items():
                reach = [machine.address, *_peer_address(found, name)]
                env = {**base, **MACHINE_ENV, **shared,
                       "DATABASE_URL": _through(base["DATABASE_URL"], machine.host_side),
                       "REDIS_URL": _through(base["REDIS_URL"], machine.host_side),
                       "BOX_DATA_DIR": str(machine.data_dir), "BOX_MACHINE": name,
                       "BOX_MACHINE_URL": f"http://{next(iter(_peer_address(found, name)))}:{PORT}",
                       "BOX_ALLOWED_HOSTS": ",".join(reach), "DJANGO_SETTINGS_MODULE": "boxsite.settings"}
                env.pop("BOX_LOCAL_DIR", None)
                envs[name] = env
                running[name] = {
                    "cluster": spawn([*machine.enter(), sys.executable, MANAGE, "runcluster"], env, tmp_path / f"{name}-cluster.log"),
                    "scheduler": spawn([*machine.enter(), sys.executable, MANAGE, "runscheduler"], env,
                                       tmp_path / f"{name}-scheduler.log"),
                    "web": spawn([*machine.enter(), sys.executable, "-m", "daphne", "-b", "0.0.0.0", "-p", str(PORT),
                                  "boxsite.asgi:application"], env, tmp_path / f"{name}-web.log"),
                }
            yield found, running
        finally:
            for name, machine in found.items():
                for proc in running.get(name, {}).values():
                    stop(proc)
                # What the machine's supervisor does once its processes stopped: nothing of its
                # tasks stays on the host (mounts, processes, task users).
                released = subprocess.run([*machine.enter(), sys.executable, "-c", RELEASE], env=envs[name],
                                          cwd=django_settings.BASE_DIR, capture_output=True, timeout=120)
                assert released.returncode == 0, released.stderr.decode(errors="replace")[-2000:]


def _vapid_key() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _peer_address(found: dict[str, SimulatedMachine], name: str) -> list[str]:
    """Where the other machines reach ``name`` (with two, one address)."""
    return [other.peers[name] for other in found.values() if other.name != name]


def _family(proc: subprocess.Popen[bytes]) -> set[int]:
    return {proc.pid, *procs.descendants(proc.pid)}


def _mounts(machine: SimulatedMachine) -> str:
    return machine.read("cat", "/proc/self/mounts")


@contextmanager
def two_machines(box: Box, tmp_path: Path) -> Iterator[tuple[Any, Any, Api, Api]]:
    """Machines a and b started, each answering and beating: what each test begins with."""
    why = namespaces.available()
    if why:
        pytest.skip(why)
    with started(tmp_path, ["a", "b"]) as (found, running):
        a, b = Api(found["a"], box.token), Api(found["b"], box.token)
        wait_for(lambda: a.answers() and b.answers(), timeout=90, what="both machines' web processes")
        wait_for(lambda: Machine.objects.filter(name__in=["a", "b"]).count() == 2, timeout=60,
                 what="both machines' beats")
        yield found, running, a, b


def test_two_machines_run_each_workspace_at_home_serve_its_reads_and_take_over_a_dead_ones(
        box: Box, tmp_path: Path) -> None:
    with two_machines(box, tmp_path) as (found, running, a, b):
        assert a.ok("GET", "/api/health")["isolation"]["limits"]["disk"]["enforced"] is True

        # Each workspace is homed where it was made; each task runs there, whichever web took it.
        assert a.ok("POST", "/api/workspaces", {"name": "wa"})["machine"] == "a"
        assert b.ok("POST", "/api/workspaces", {"name": "wb"})["machine"] == "b"
        made = {"wa": [b.ok("POST", "/api/tasks", {"title": f"wa{i}", "workspace": "wa",
                                                   "flow": flow({"run": f"echo wa{i} | tee wa{i}.txt"})})["id"] for i in range(2)],
                "wb": [a.ok("POST", "/api/tasks", {"title": f"wb{i}", "workspace": "wb",
                                                   "flow": flow({"run": f"echo wb{i} | tee wb{i}.txt"})})["id"] for i in range(2)]}
        for ids in made.values():
            for task_id in ids:
                wait_for(lambda task_id=task_id: a.state(task_id) in ("done", "failed"), timeout=120,
                         what=f"task {task_id} to end")
                assert a.state(task_id) == "done"
        clusters = {name: _family(running[name]["cluster"]) for name in running}
        for workspace, home in (("wa", "a"), ("wb", "b")):
            pids = set(Run.objects.filter(task_id__in=made[workspace]).values_list("worker_pid", flat=True))
            assert pids <= clusters[home], (workspace, pids, clusters)

        # A task's artifact read at the other machine's web process: the bytes its machine wrote.
        artifact = "step-1-run-1-stdout.txt"
        assert b.raw("GET", f"/api/tasks/{made['wa'][0]}/artifacts/{artifact}") == (200, b"wa0\n")
        assert a.raw("GET", f"/api/tasks/{made['wb'][1]}/artifacts/{artifact}") == (200, b"wb1\n")
        assert a.raw("GET", f"/api/tasks/{made['wb'][1]}/artifacts/no-such.txt")[0] == 404

        # A running task's diff, with its disk limit on, read at the other machine's web process:
        # the machine that runs it reads it, and the image is mounted by that machine alone.
        live = a.ok("POST", "/api/tasks", {"title": "live", "workspace": "wa",
                                           "flow": flow({"run": "echo live > live.txt; sleep 6; echo end >> live.txt"})})["id"]
        wait_for(lambda: "live.txt" in b.ok("GET", f"/api/tasks/{live}/diff")["added"],
                 timeout=60, what="the running task's file in its diff, read through machine b")
        assert b.state(live) == "running"
        assert f"layers/{live}/disk" in _mounts(found["a"])
        assert live not in _mounts(found["b"])
        assert b.ok("GET", "/api/workspaces/wa/files", None) is not None

        # Machine a dies (its worker cluster and scheduler, with every process they started); its
        # web process stays to hand its disk over. Its workspace moves to b, where its tasks finish.
        running_on_a = Run.objects.get(task_id=live, state=RunState.RUNNING)
        assert running_on_a.worker_pid in clusters["a"]
        for role in ("cluster", "scheduler"):
            os.killpg(running["a"][role].pid, signal.SIGKILL)
            running["a"][role].wait()
        later = b.ok("POST", "/api/tasks", {"title": "after", "workspace": "wa",
                                            "flow": flow({"run": "cat wa0.txt wa1.txt > after.txt"})})["id"]
        wait_for(lambda: Workspace.objects.get(name="wa").machine == "b", timeout=120, what="workspace wa to move to b")
        for task_id in (live, later):
            wait_for(lambda task_id=task_id: b.state(task_id) in ("done", "failed"), timeout=120,
                     what=f"task {task_id} to end on b")
            assert b.state(task_id) == "done", b.ok("GET", f"/api/tasks/{task_id}")
        live_runs = list(Run.objects.filter(task_id=live).order_by("number"))
        assert live_runs[0].state == RunState.LOST and live_runs[-1].state == RunState.FINISHED
        assert live_runs[-1].worker_pid in _family(running["b"]["cluster"])
        assert any("moved from machine 'a' to 'b'" in event["summary"] for event in box.events(live))

        # Nothing lost: the done tasks' layers came with the workspace, and the new task saw them.
        after = b.ok("GET", "/api/workspaces/wa/files?path=after.txt")
        assert after["content"] == "wa0\nwa1\n", after
        assert b.ok("GET", "/api/workspaces/wa/files?path=live.txt")["content"] == "live\nend\n"
        assert b.ok("GET", "/api/workspaces/wa")["machine"] == "b"
        # wb stayed where it was.
        assert Workspace.objects.get(name="wb").machine == "b"

        # An upload and an undo asked of a's web process (its cluster dead) are made by b, which
        # holds wa now: the upload's layer is on b's disk, the undone task's file is gone there.
        status, body = a.raw("PUT", "/api/workspaces/wa/files/notes/up.txt", b"uploaded\n")
        assert status == 201, body
        uploaded = json.loads(body)["task"]["id"]
        assert (found["b"].disk / "layers" / uploaded).is_dir()
        assert not (found["a"].disk / "layers" / uploaded).exists()
        assert b.ok("GET", "/api/workspaces/wa/files?path=notes/up.txt")["content"] == "uploaded\n"
        assert a.raw("GET", "/api/workspaces/wa/files/notes/up.txt") == (200, b"uploaded\n")
        assert a.ok("POST", f"/api/tasks/{later}/undo")["state"] == "undone"
        assert b.call("GET", "/api/workspaces/wa/files?path=after.txt")[0] == 404
        assert a.ok("POST", f"/api/tasks/{uploaded}/undo")["state"] == "undone"
        assert a.call("GET", "/api/workspaces/wa/files?path=notes/up.txt")[0] == 404
        assert a.call("POST", f"/api/tasks/{uploaded}/undo")[0] == 409  # the holder's refusal, passed on


def test_a_workspace_of_a_machine_gone_with_its_disk_is_abandoned_by_the_owner_and_starts_afresh(
        box: Box, tmp_path: Path) -> None:
    with two_machines(box, tmp_path) as (found, running, a, b):
        assert a.ok("POST", "/api/workspaces", {"name": "wa"})["machine"] == "a"
        done = a.ok("POST", "/api/tasks", {"title": "done", "workspace": "wa", "flow": flow({"run": "echo 1 > one.txt"})})["id"]
        wait_for(lambda: a.state(done) in ("done", "failed"), timeout=120, what="the first task to end")
        assert a.state(done) == "done"
        status, refused = b.call("POST", "/api/workspaces/wa/abandon", {})
        assert status == 409 and refused["code"] == "MACHINE_ALIVE", refused  # a live machine's is moved, not given up

        # Machine a is gone with its disk: web process, worker cluster and scheduler.
        for proc in running["a"].values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        waiting = b.ok("POST", "/api/tasks", {"title": "waiting", "workspace": "wa", "flow": flow({"run": "ls > seen.txt"})})["id"]
        wait_for(lambda: Workspace.objects.get(name="wa").moving_to == "b", timeout=120,
                 what="the scheduler to try moving wa to b")
        assert b.state(waiting) == "queued"  # its copy cannot be made: it waits for a's disk

        assert b.ok("POST", "/api/workspaces/wa/abandon", {"machine": "b"})["movingTo"] == "b"
        wait_for(lambda: Workspace.objects.get(name="wa").machine == "b", timeout=120, what="wa to start afresh on b")
        # The lost tasks say so: the done one is undone, the one not over failed and may be retried.
        assert b.state(done) == "undone" and b.state(waiting) == "failed"
        for task_id in (done, waiting):
            assert any("lost with machine 'a'" in event["summary"] for event in box.events(task_id))
        assert b.ok("GET", "/api/workspaces/wa/files")["entries"] == []
        b.ok("POST", f"/api/tasks/{waiting}/retry", {})
        wait_for(lambda: b.state(waiting) in ("done", "failed"), timeout=120, what="the retried task to end on b")
        assert b.state(waiting) == "done"
        assert b.ok("GET", "/api/workspaces/wa/files?path=seen.txt")["content"] == "seen.txt\n"
