"""Cleanup that always works: cancel, a killed worker, and start-up reconcile."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from tasks import sandbox
from tasks.models import Task
from tasks.run import lifecycle
from tasks.sandbox import accounts, cleanup, paths, users
from tasks.sandbox.accounts import processes_of, running_processes_of
from tasks.sandbox.cleanup import release
from tasks.sandbox.paths import runtime_dir
from tests.cluster import running_box
from tests.conftest import database_env, queue_through_the_cluster, wait_for
from tests.factories import flow
from tests.sandbox.conftest import needs_sandbox, outputs, uid_of
from tests.test_runbox import _children

pytestmark = needs_sandbox

# The task double-forks a daemon (its parent exits at once, so it is nobody's child but init's),
# says so, and then works for a long time.
DAEMON = "sh -c 'setsid sleep 1001 </dev/null >/dev/null 2>&1 &'; echo started; exec sleep 1002"


@pytest.fixture
def cluster_mode(settings):
    queue_through_the_cluster(settings)


def _processes(uid: int) -> list[int]:
    """The user's processes still running (one that exited may wait a while for the machine's
    init to reap it: the sandbox's init is reparented there when its worker is killed)."""
    return running_processes_of(uid)


def _started(box, task_id: str) -> int:
    wait_for(lambda: "started" in outputs(box, task_id), timeout=60, what="the task to start its daemon")
    uid = uid_of(task_id)
    assert uid is not None
    wait_for(lambda: len(_processes(uid)) >= 3, what="the daemon and the worker process")  # init, sleep, daemon
    return uid


def _gone(task_id: str, uid: int) -> bool:
    return not _processes(uid) and uid_of(task_id) is None and not runtime_dir(task_id).exists()


def test_cancelling_a_task_stops_its_double_forked_daemon_and_removes_its_user(sandboxed, cluster_mode, tmp_path):
    with running_box(tmp_path, scheduler=False):
        task = sandboxed.create(title="daemon", prompt="p", worker="command", command=["/bin/sh", "-c", DAEMON])
        uid = _started(sandboxed, task["id"])
        response = sandboxed.api.post(f"/api/tasks/{task['id']}/cancel")
        assert response.status_code == 200, response.json()
        wait_for(lambda: _gone(task["id"], uid), what="every process of the task's user, the user and its sockets to go")
        assert sandboxed.wait_state(task["id"], "cancelled")["state"] == "cancelled"


def test_a_killed_worker_leaves_nothing_once_its_task_is_given_up(sandboxed, cluster_mode, tmp_path):
    with running_box(tmp_path, BOX_MAX_RUN_ATTEMPTS="1") as procs:
        task = sandboxed.create(title="orphan", prompt="p", worker="command", command=["/bin/sh", "-c", DAEMON])
        uid = _started(sandboxed, task["id"])
        os.killpg(procs["worker"].pid, signal.SIGKILL)  # the worker dies mid-run, like a crash
        procs["worker"].wait()
        # The sandbox (daemons included) dies with the worker that started it, before any cleanup.
        wait_for(lambda: not _processes(uid), timeout=5, what="the task's processes to die with their worker")
        view = sandboxed.wait_state(task["id"], "failed", timeout=60)  # the reaper gives up on the lost run
        assert "lost" in view["error"]
        wait_for(lambda: _gone(task["id"], uid), what="the failed task's processes and user to go")


def test_start_up_reconciles_users_of_ended_and_unknown_tasks_and_spares_active_ones(sandboxed, tmp_path):
    ended = sandboxed.create(title="ended", flow=flow({"run": "true"}))
    assert sandboxed.wait_state(ended["id"], "done")["state"] == "done"
    active = sandboxed.create(title="active", flow=flow({"ask": "name"}))  # waits for input: still active
    assert sandboxed.wait_state(active["id"], "waiting")["state"] == "waiting"
    # The ended task's own release, in the background, must be over before the crash's leftovers
    # are made up for it: it would remove them as they are made.
    assert lifecycle.janitor.drain()
    unknown_id = "tkunknown0000"
    sleepers = []
    for task_id in (ended["id"], unknown_id, active["id"]):
        # What a crash leaves: the user, a runtime directory, and a process still running as it.
        ident = users.ensure_user(task_id)
        paths.ensure_runtime_dir(task_id, ident.uid, ident.gid)
        users.mark_ran(ident)  # as the launcher does before it starts a process as the user
        sleeper = subprocess.Popen(["setpriv", f"--reuid={ident.uid}", f"--regid={ident.gid}", "--clear-groups",
                                    "sleep", "1003"], start_new_session=True)
        sleepers.append(sleeper)
        # Until setpriv has taken the user's ids, the process is root's and no sweep of the user's
        # processes can find it (on a loaded machine reconcile could run first).
        wait_for(lambda: sleeper.pid in processes_of(ident.uid), what="the process to run as the task's user")
    assert Task.objects.filter(pk=active["id"], state="waiting").exists()
    try:
        env = database_env()
        done = subprocess.run([sys.executable, str(Path(django_settings.BASE_DIR) / "manage.py"), "runscheduler", "--once"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        for task_id in (ended["id"], unknown_id):
            assert uid_of(task_id) is None, f"the user of {task_id} survived reconcile"
            assert not paths.runtime_dir(task_id).exists()
        assert uid_of(active["id"]) is not None  # an active task keeps its user
        for sleeper in sleepers[:2]:
            assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert sleepers[2].poll() is None
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()

        release(unknown_id)


def test_a_task_of_file_steps_alone_is_released_without_sweeping_processes_or_keyrings(sandboxed, monkeypatch):
    """The /proc scan and the keyring sweep (a start of the system Python) cost most of a trivial
    task's release; a user no process ran as has nothing for them to find. A task that ran a
    command is still swept."""
    swept: list[str] = []
    kill_processes, clear_keyrings = accounts.kill_processes, accounts.clear_keyrings
    monkeypatch.setattr(accounts, "kill_processes", lambda uid, **kw: swept.append("processes") or kill_processes(uid, **kw))
    monkeypatch.setattr(accounts, "clear_keyrings", lambda ident: swept.append("keyrings") or clear_keyrings(ident))

    def run(steps: dict[str, Any]) -> str:
        task = sandboxed.create(title="release", flow=flow(steps))
        assert sandboxed.wait_state(task["id"], "done", "failed")["state"] == "done"
        lifecycle.janitor.drain()
        assert uid_of(task["id"]) is None  # released: its user is back in the pool
        return str(task["id"])

    run({"write": {"path": "a.txt", "content": "a"}})
    assert swept == []
    run({"run": "true"})
    assert swept == ["processes", "keyrings"]
    assert not any(users.ran_processes(ident) for ident in users.pool_users())  # swept: no user is left marked


def test_a_release_that_failed_a_step_is_tried_again_and_the_user_goes_back_to_the_pool(sandboxed, monkeypatch):
    """A release step that fails once (a mount still busy, a process not yet gone) used to leave
    the task's user claimed until the box's next start."""
    failed: list[str] = []
    release_rest = sandbox.release

    def fails_once(task_id: str, **kw: Any) -> None:
        if not failed:
            failed.append(task_id)
            raise OSError("busy for a moment")
        release_rest(task_id, **kw)

    monkeypatch.setattr(sandbox, "release", fails_once)
    monkeypatch.setattr(lifecycle, "RELEASE_RETRY_S", (0.01, 0.01))
    task = sandboxed.create(title="release", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    assert sandboxed.wait_state(task["id"], "done", "failed")["state"] == "done"
    lifecycle.janitor.drain()
    assert failed == [task["id"]]
    assert uid_of(task["id"]) is None  # released on the second try: its user is back in the pool


def test_tasks_one_after_another_reuse_the_pool_users_without_making_or_deleting_any(sandboxed, monkeypatch):
    """A refill after each claim and a deletion at each give-back would cost every task a
    ``useradd`` and a ``userdel`` (tens of ms of CPU each, under a machine-wide lock)."""
    made: list[str] = []
    deleted: list[str] = []
    create, remove = accounts.create, accounts.remove_user
    monkeypatch.setattr(accounts, "create", lambda name: made.append(name) or create(name))
    users.fill_pool()  # as the box's start does
    monkeypatch.setattr(accounts, "remove_user", lambda name: deleted.append(name) or remove(name))
    for i in range(4):
        task = sandboxed.create(title=f"trivial {i}", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
        assert sandboxed.wait_state(task["id"], "done", "failed")["state"] == "done"
        lifecycle.janitor.drain()
        if i == 0:  # the first claim tops the spares up once; the pool then holds them and the one running
            made.clear()
    assert (made, deleted) == ([], [])


def _mounts_of(task_id: str) -> list[str]:
    data_dir = str(django_settings.BOX_DATA_DIR)
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if data_dir in line and task_id in line]


def test_a_cluster_stopped_while_a_release_is_pending_finishes_it(sandboxed, cluster_mode, tmp_path):
    """A task's release runs in its worker's background janitor after the final state; a stop
    that ends the worker inside that window must still release it (view, user, processes)."""
    with running_box(tmp_path, scheduler=False) as procs:
        leader = procs["worker"]
        task = sandboxed.create(title="ends right before the stop", flow=flow({"write": {"path": "a.txt", "content": "a"}},
                                                                               {"run": "cat a.txt"}))
        # Holding the task's release lock keeps the worker's janitor inside the release window.
        with users.task_lock(task["id"]):
            assert sandboxed.wait_state(task["id"], "done", "failed", timeout=60)["state"] == "done"
            uid = uid_of(task["id"])
            assert uid is not None and _mounts_of(task["id"]), "the release finished before the stop: no window"
            leader.send_signal(signal.SIGTERM)
            # The leader ends its processes (the janitor with its pending release among them) and
            # then waits on the lock for its own release of the task.
            wait_for(lambda: not _children(leader.pid), timeout=30, what="the cluster's workers to be gone")
            assert leader.poll() is None
        assert leader.wait(timeout=60) == 0
        assert _mounts_of(task["id"]) == []
        assert uid_of(task["id"]) is None and not _processes(uid)  # given back, scrubbed


def test_the_stop_removes_a_pool_user_whose_maker_was_killed_while_making_it(settings: Any) -> None:
    """A worker killed at the stop while it made a pool user leaves it claimed as being made by a
    process that is gone; the stop's sweep of the pool still removes that user."""
    settings.BOX_USER_POOL = 1
    users.empty_pool()
    users.fill_pool()
    [ident] = [i for i in users.pool_users() if i.name not in users.claims()]
    gone = subprocess.Popen(["true"])
    gone.wait()
    os.symlink(f".fill-{gone.pid}", users.pool_dir() / ident.name)  # as fill_pool leaves it when killed
    assert ident.name in users.claims()
    lifecycle.empty_spare_pool()
    assert ident.name not in [i.name for i in users.pool_users()]
    assert ident.name not in users.claims()


def test_a_dependent_starts_on_its_dependencys_sealed_layer_without_waiting_for_the_rest_of_its_release(
        sandboxed, monkeypatch):
    """A task that ended is released in the background: processes killed and files handed back,
    the layer sealed, then the slow rest (the keyring sweep, the user back to the pool). A task
    that depends on it waits only for the seal: it runs, and sees the files its dependency made
    as root's (never as nobody's), while the keyring sweep is still going on."""
    sweeping, go_on, swept = threading.Event(), threading.Event(), threading.Event()
    sweep = accounts.clear_keyrings

    def slow_sweep(ident: accounts.Identity) -> None:
        sweeping.set()
        go_on.wait(timeout=20)
        sweep(ident)
        swept.set()

    monkeypatch.setattr(accounts, "clear_keyrings", slow_sweep)
    try:
        upstream = sandboxed.create(title="makes a file", flow=flow({"run": "echo made > made.txt"}))
        assert sandboxed.wait_state(upstream["id"], "done", "failed")["state"] == "done"
        wait_for(sweeping.is_set, timeout=30, what="the upstream's release to reach its keyring sweep")
        dependent = sandboxed.create(title="reads it", dependsOn=[upstream["id"]],
                                     flow=flow({"run": "cat made.txt && stat -c owner=%u made.txt"}))
        view = sandboxed.wait_state(dependent["id"], "done", "failed", timeout=30)
        assert not swept.is_set(), "the dependent waited for its dependency's keyring sweep"
        assert view["state"] == "done", view
        [result] = [e["data"] for e in sandboxed.events(dependent["id"]) if e["kind"] == "step_result"]
        assert result["stdout"].startswith("made\nowner="), result
        assert result["stdout"] != "made\nowner=65534", result  # an owner outside its id map: "nobody"
        layer_file = Path(django_settings.BOX_DATA_DIR) / "layers" / upstream["id"] / "upper" / "made.txt"
        assert layer_file.stat().st_uid == 0
        assert uid_of(upstream["id"]) is not None  # its user is not back in the pool before the sweep
    finally:
        go_on.set()
    lifecycle.janitor.drain()
    assert swept.is_set() and uid_of(upstream["id"]) is None  # then the sweep ran and the user went back


def test_handing_files_back_passes_over_an_entry_gone_since_its_directory_was_listed(tmp_path: Path, monkeypatch: Any) -> None:
    """The layer's release drops a settled disk image's mount point in the background, while the
    sandbox's release walks the layer to hand its user's files back: that walk must not fail."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "kept.txt").write_text("x")
    os.chown(tmp_path / "kept.txt", 4242, 4242)
    lstat = os.lstat

    def vanishing(path: Any) -> os.stat_result:
        if str(path).endswith("/disk"):
            os.rmdir(path)  # gone between the listing and the look
        return lstat(path)

    monkeypatch.setattr(os, "lstat", vanishing)
    cleanup._disown_tree(tmp_path, accounts.Identity("box-t", 4242, 4242))
    monkeypatch.setattr(os, "lstat", lstat)
    assert (lstat(tmp_path / "kept.txt").st_uid, lstat(tmp_path / "kept.txt").st_gid) == (0, 0)


def _free_users() -> list[str]:
    held = users.claims()
    return [ident.name for ident in users.pool_users() if ident.name not in held]


def test_users_given_back_after_a_burst_stay_until_the_pool_is_quiet(sandboxed, monkeypatch):
    """A burst whose releases lag its starts holds many users at once. Deleting the surplus at
    each give-back made the next burst create them all again (a ``useradd`` and a ``userdel``
    each, per burst); the surplus now goes once the pool has been quiet for a while."""
    held = [(f"tkburst{i}", users.claim_user(f"tkburst{i}")[0]) for i in range(3 * django_settings.BOX_USER_POOL)]
    for task_id, ident in held:
        users.give_back(task_id, ident)
    everyone = set(_free_users())
    assert {ident.name for _, ident in held} <= everyone  # none deleted at its give-back

    assert users.trim_pool() == 0  # the pool was busy just now
    assert set(_free_users()) == everyone

    monkeypatch.setattr(users, "TRIM_IDLE_S", 0.0)  # as if quiet for long enough
    users.trim_pool()
    assert len(_free_users()) == 2 * django_settings.BOX_USER_POOL
    assert set(_free_users()) <= everyone


def test_an_idle_janitor_trims_the_pool_once_it_is_quiet(sandboxed, monkeypatch):
    monkeypatch.setattr(users, "TRIM_IDLE_S", 0.3)
    held = [(f"tkidle{i}", users.claim_user(f"tkidle{i}")[0]) for i in range(3 * django_settings.BOX_USER_POOL)]
    for task_id, ident in held:
        users.give_back(task_id, ident)
    task = sandboxed.create(title="then quiet", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    assert sandboxed.wait_state(task["id"], "done", "failed")["state"] == "done"
    lifecycle.janitor.drain()  # its release done; it then waits for the quiet and trims
    wait_for(lambda: len(_free_users()) == 2 * django_settings.BOX_USER_POOL, timeout=30, what="the surplus deleted")


def test_a_group_left_without_its_user_neither_blocks_new_pool_users_nor_outlives_the_start_up(
        settings: Any, db: None, tmp_path: Path) -> None:
    """A worker killed while ``userdel`` ran can leave the user's group behind. ``useradd
    --user-group`` of that name then fails, and every task that needed a new pool user failed to
    start (CI saw one such name fail 82 tasks). The name is passed over, and start-up removes the
    group."""
    # A box of its own: any other box process of the worker's data directory starting or stopping
    # meanwhile removes the group too (as it should), before the test has looked.
    settings.BOX_DATA_DIR = tmp_path / "box"
    settings.BOX_LOCAL_DIR = None
    settings.BOX_USER_POOL = 0  # every claim makes a user: the name's first choice is used at once
    orphan = users._new_name(set())
    subprocess.run(["groupadd", "--system", orphan], check=True)
    try:
        ident, fresh = users.claim_user("tkorphan1")
        assert fresh and ident.name != orphan and users.find_user("tkorphan1") == ident
        users.give_back("tkorphan1", ident)
        assert users.find_user("tkorphan1") is None

        assert users.orphan_groups() == [orphan]

        cleanup.reconcile()
        assert users.orphan_groups() == []
        assert not accounts.group_exists(orphan)
    finally:
        users.empty_pool()
        subprocess.run(["groupdel", orphan], capture_output=True, check=False)



def _killed_inside(tool: str, first_half: str, code: str, tmp_path: Path, *, kill: str = "kill -9 $PPID") -> None:
    """Run ``code`` in a box process of its own (``manage.py shell``, a user per task, in a
    session of its own) whose ``tool`` does ``first_half`` of the real tool's work on the
    account named last (``$name``), then kills that process (SIGKILL, as a killed worker would
    end it; ``kill``: another way)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / tool).write_text(f'#!/bin/sh\nfor name; do :; done\n{first_half}\n{kill}\n')
    (fake / tool).chmod(0o755)
    env = {**database_env(), "BOX_DATA_DIR": str(django_settings.BOX_DATA_DIR), "BOX_USER_POOL": "0",
           "PATH": f"{fake}:{os.environ['PATH']}"}
    env.pop("BOX_LOCAL_DIR", None)
    done = subprocess.run([sys.executable, str(Path(django_settings.BASE_DIR) / "manage.py"), "shell", "-c", code],
                          env=env, cwd=django_settings.BASE_DIR, capture_output=True, timeout=120, start_new_session=True)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr.decode()[-2000:])


@pytest.fixture
def own_box(settings: Any, tmp_path: Path) -> Any:
    """A box of its own, with a user per task: any other box process of the worker's data
    directory starting or stopping meanwhile would clean up what the test looks for."""
    settings.BOX_DATA_DIR = tmp_path / "box"
    settings.BOX_LOCAL_DIR = None
    settings.BOX_USER_POOL = 0
    yield settings
    users.drop_stale_claims()
    users.empty_pool()
    users.remove_orphan_groups()


def test_a_give_back_killed_inside_userdel_leaves_no_claim_or_group_after_the_start_up(own_box, db, tmp_path):
    """With a user per task the give-back deletes the user while it is still claimed. Killed
    between ``userdel``'s removal of the user and of its group, the task's claim named a user
    that was gone: no release or start-up looked at it again, and the name and its group stayed
    taken for good."""
    userdel = shutil.which("userdel")
    _killed_inside("userdel", f'{userdel} "$name" && groupadd --system "$name"',
                   "from tasks.sandbox import users\n"
                   "ident, _ = users.claim_user('tkhalfdel1')\nusers.give_back('tkhalfdel1', ident)", tmp_path)
    [left] = users.userless_groups()
    assert users.find_user("tkhalfdel1") is None

    cleanup.reconcile()
    assert users.userless_groups() == [] and not accounts.group_exists(left)
    assert users.claims() == {}


def test_a_run_killed_inside_useradd_leaves_its_task_a_user_to_claim(own_box, db, tmp_path):
    """The pool empty, a claim makes its user. Killed after ``useradd`` made the group and
    before the user, the task held a claim naming a user that never came: its next run made that
    name again, and ``useradd --user-group`` failed on the group, run after run."""
    _killed_inside("useradd", 'groupadd --system "$name"',
                   "from tasks.sandbox import users\nusers.claim_user('tkhalfadd1')", tmp_path)
    [left] = users.userless_groups()
    assert users.find_user("tkhalfadd1") is None

    ident, fresh = users.claim_user("tkhalfadd1")  # the task's next run
    assert fresh and ident.name != left and users.find_user("tkhalfadd1") == ident
    users.give_back("tkhalfadd1", ident)

    cleanup.reconcile()
    assert users.userless_groups() == [] and users.claims() == {}


def test_a_kill_of_the_box_process_group_lets_its_account_tool_finish(own_box, db, tmp_path):
    """A stop ends with a SIGKILL of the box process's whole group, which cut a ``userdel``
    still running half-way: CI found a pool user's group left after a cluster's stop. The tool
    runs in a session of its own, and finishes; start-up then drops the dead process's claim."""
    userdel, done = shutil.which("userdel"), tmp_path / "userdel-finished"
    # The fake tool kills the box process's group first (as the stop does), then does the real work.
    _killed_inside("userdel", "kill -9 -$(ps -o pgid= -p $PPID | tr -d ' ')",
                   "from tasks.sandbox import users\n"
                   "ident, _ = users.claim_user('tkgroupkill1')\nusers.give_back('tkgroupkill1', ident)", tmp_path,
                   kill=f'{userdel} "$name" && touch {done}')
    wait_for(done.exists, timeout=30, what="the account tool to finish after its box process was killed")
    assert users.find_user("tkgroupkill1") is None

    cleanup.reconcile()
    assert users.pool_users() == [] and users.userless_groups() == [] and users.claims() == {}
