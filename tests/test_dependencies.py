"""Dependencies (docs/internals/task-graph.md#dependencies): a task starts only when the tasks it depends
on allow it, fails with the reason when they never can, and sees their done layers."""
from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.brokers import get_broker

from boxsite.core.auth import issue_api_token
from boxsite.models import BoxSettings
from tasks import dependencies, jobs, services
from tasks.models import Dependency, EventKind, Layer, Run, RunKind, Task, TaskEvent
from tasks.run import finish as finalize
from tasks.run import leases as runs
from tasks.run import lifecycle, worker
from tests.conftest import Box, wait_for
from tests.factories import flow, make_owner

WRITE = {"write": {"path": "outputs/report.md", "content": "# report\n"}}


def gated(*after: dict[str, Any]) -> dict[str, Any]:
    """A flow that waits for the owner's OK, then does ``after`` (nothing: it just ends)."""
    return flow({"approve": "go on?"}, *(after or ({"write": {"path": "gate.txt", "content": "ok"}},)))


def held(box: Box, **spec: Any) -> dict[str, Any]:
    """A task that waits for the owner at its first step."""
    task = box.create(title=spec.pop("title", "upstream"), flow=gated(*spec.pop("after", ())), **spec)
    box.wait_state(task["id"], "waiting")
    return task


def approve(box: Box, task_id: str) -> None:
    response = box.api.post(f"/api/tasks/{task_id}/continue", {"approve": True}, format="json")
    assert response.status_code == 200, response.json()


def end(box: Box, task_id: str, how: str) -> None:
    """Bring a held task to ``done``, ``failed`` or ``cancelled`` through the API."""
    if how == "cancelled":
        assert box.api.post(f"/api/tasks/{task_id}/cancel").status_code == 200
    else:
        approve(box, task_id)
    box.wait_state(task_id, how)


def runs_of(task_id: str) -> list[str]:
    return list(Run.objects.filter(task_id=task_id).order_by("number").values_list("kind", flat=True))


def test_a_dependent_waits_without_a_run_then_starts_when_its_dependency_is_done_and_sees_its_layer(box: Box) -> None:
    upstream = held(box, after=[WRITE])
    dependent = box.create(title="downstream", flow=flow({"write": {"path": "b.txt", "content": "b"}}),
                           dependsOn=[upstream["id"]])
    view = box.task(dependent["id"])
    assert view["state"] == "queued" and view["startedAt"] is None
    assert view["dependsOn"] == [{"task": upstream["id"], "condition": "success", "required": True}]
    assert runs_of(dependent["id"]) == []  # nothing queued: no worker is spent on waiting
    assert services.release_waiting() == 0  # the scheduler's sweep leaves it waiting

    end(box, upstream["id"], "done")
    done = box.wait_state(dependent["id"], "done")
    assert upstream["id"] in done["layers"]  # it saw its dependency's done layer
    assert runs_of(dependent["id"]) == [RunKind.START]
    files = box.api.get("/api/workspaces/home/files", {"path": "outputs"}).json()
    assert "report.md" in str(files)


def test_the_sweep_reads_once_and_decides_nothing_while_every_dependency_is_active(box: Box) -> None:
    upstream = held(box)
    box.create(title="downstream", flow=flow(WRITE), dependsOn=[upstream["id"]])

    with CaptureQueriesContext(connection) as sweep:
        assert services.release_waiting() == 0

    assert len(sweep.captured_queries) == 1  # no transaction per waiting task (SQLite's write lock)


# (dependency's final state, condition, required) -> does the dependent run?
CASES = [
    ("done", "success", True, True),
    ("failed", "success", True, False),
    ("cancelled", "success", True, False),
    ("done", "completion", True, True),
    ("failed", "completion", True, True),
    ("cancelled", "completion", True, True),
    ("cancelled", "artifact", True, False),
    ("failed", "success", False, True),  # an optional edge waits for the end, then lets go
    ("cancelled", "artifact", False, True),
]


@pytest.mark.parametrize(("how", "condition", "required", "runs"), CASES)
def test_each_condition_under_each_final_state(box: Box, how: str, condition: str, required: bool, runs: bool) -> None:
    # approving the failing upstream runs a delete of a missing file: it fails
    after = [{"delete": {"path": "missing.txt"}}] if how == "failed" else [WRITE]
    root = held(box, title="one root")  # within one root a failed edge fails its task (no recovery review)
    upstream = held(box, after=after, parent=root["id"])
    edge: dict[str, Any] = {"task": upstream["id"], "condition": condition, "required": required}
    if condition == "artifact":
        edge["artifact"] = "outputs/report.md"
    dependent = box.create(title="downstream", flow=flow({"write": {"path": "b.txt", "content": "b"}}), dependsOn=[edge],
                           parent=root["id"])
    assert box.task(dependent["id"])["state"] == "queued"
    end(box, upstream["id"], how)
    if runs:
        box.wait_state(dependent["id"], "done")
    else:
        failed = box.wait_state(dependent["id"], "failed")
        assert failed["error"].startswith(f"cannot start: dependency {upstream['id']} ended {how}")
        assert failed["startedAt"] is None and runs_of(dependent["id"]) == []


def test_an_artifact_edge_needs_the_named_file_in_the_dependencys_layer(box: Box) -> None:
    root = held(box, title="one root")
    with_file = held(box, after=[WRITE], parent=root["id"])
    without = held(box, after=[{"write": {"path": "outputs/other.md", "content": "x"}}], parent=root["id"])
    edge = {"condition": "artifact", "artifact": "outputs/report.md"}
    gets = box.create(title="gets it", flow=flow({"write": {"path": "g.txt", "content": "g"}}),
                      dependsOn=[{"task": with_file["id"], **edge}], parent=root["id"])
    misses = box.create(title="misses it", flow=flow({"write": {"path": "m.txt", "content": "m"}}),
                        dependsOn=[{"task": without["id"], **edge}], parent=root["id"])
    end(box, with_file["id"], "done")
    end(box, without["id"], "done")
    box.wait_state(gets["id"], "done")
    failed = box.wait_state(misses["id"], "failed")
    assert failed["error"] == f"cannot start: dependency {without['id']} is done but left no file 'outputs/report.md'"


def test_a_task_waits_for_every_required_edge(box: Box) -> None:
    first, second = held(box, title="first"), held(box, title="second")
    dependent = box.create(title="both", flow=flow({"write": {"path": "b.txt", "content": "b"}}),
                           dependsOn=[first["id"], {"task": second["id"], "condition": "completion"}])
    end(box, first["id"], "done")
    assert box.task(dependent["id"])["state"] == "queued" and runs_of(dependent["id"]) == []
    end(box, second["id"], "cancelled")
    box.wait_state(dependent["id"], "done")


def test_a_dependency_that_already_ended_decides_at_creation(box: Box) -> None:
    done = held(box, title="done")
    end(box, done["id"], "done")
    cancelled = held(box, title="cancelled")
    end(box, cancelled["id"], "cancelled")
    starts = box.create(title="starts", flow=flow({"write": {"path": "s.txt", "content": "s"}}), dependsOn=[done["id"]])
    box.wait_state(starts["id"], "done")
    never = box.create(title="never", flow=flow({"write": {"path": "n.txt", "content": "n"}}), dependsOn=[cancelled["id"]])
    assert never["state"] == "failed" and "ended cancelled" in never["error"]


def test_a_failure_runs_down_a_chain(box: Box) -> None:
    root = held(box, title="one root")
    top = held(box, title="top", parent=root["id"])
    middle = box.create(title="middle", flow=gated(), dependsOn=[top["id"]], parent=root["id"])
    bottom = box.create(title="bottom", flow=gated(), dependsOn=[middle["id"]], parent=root["id"])
    end(box, top["id"], "cancelled")
    assert "ended cancelled" in box.wait_state(middle["id"], "failed")["error"]
    assert f"dependency {middle['id']} ended failed" in box.wait_state(bottom["id"], "failed")["error"]


@pytest.mark.parametrize(("depends_on", "field", "code"), [
    ("tk1", "dependsOn", "INVALID_SPEC"),
    ([{"task": "tk1", "condition": "maybe"}], "dependsOn[0].condition", "INVALID_SPEC"),
    ([{"task": "tk1", "condition": "artifact"}], "dependsOn[0].artifact", "INVALID_SPEC"),
    ([{"task": "tk1", "condition": "artifact", "artifact": "../etc/passwd"}], "dependsOn[0].artifact", "INVALID_SPEC"),
    ([{"task": "tk1", "condition": "artifact", "artifact": "outputs/../../x"}], "dependsOn[0].artifact", "INVALID_SPEC"),
    ([{"task": "tk1", "required": "yes"}], "dependsOn[0].required", "INVALID_SPEC"),
    ([{"task": "tk1", "then": 1}], "dependsOn[0].then", "INVALID_SPEC"),
    (["tk0nothere"], "dependsOn", "INVALID_SPEC"),
])
def test_bad_dependencies_are_refused_whole(box: Box, depends_on: Any, field: str, code: str) -> None:
    before = Task.objects.count()
    response = box.api.post("/api/tasks", {"title": "x", "flow": gated(), "dependsOn": depends_on}, format="json")
    assert response.status_code == 400, response.json()
    assert (response.json()["code"], response.json()["field"]) == (code, field)
    assert Task.objects.count() == before


def test_another_owners_task_is_no_dependency(box: Box) -> None:
    theirs = held(box, title="theirs")
    other = make_owner()
    _, raw = issue_api_token(other, "other")
    box.api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = box.api.post("/api/tasks", {"title": "x", "flow": gated(), "dependsOn": [theirs["id"]]}, format="json")
    assert response.status_code == 400 and response.json()["message"] == f"no task '{theirs['id']}'"


def test_edges_added_later_go_through_the_cycle_check(box: Box) -> None:
    gate = held(box, title="gate")
    x = box.create(title="x", flow=gated(), dependsOn=[gate["id"]])
    y = box.create(title="y", flow=gated(), dependsOn=[x["id"]])
    z = box.create(title="z", flow=gated(), dependsOn=[y["id"]])
    closing = box.api.post(f"/api/tasks/{x['id']}/dependencies", {"task": z["id"]}, format="json")
    assert closing.status_code == 409 and closing.json()["code"] == "DEPENDENCY_CYCLE", closing.json()
    itself = box.api.post(f"/api/tasks/{x['id']}/dependencies", {"task": x["id"]}, format="json")
    assert itself.status_code == 400
    again = box.api.post(f"/api/tasks/{y['id']}/dependencies", {"task": x["id"]}, format="json")
    assert again.status_code == 409
    started = box.api.post(f"/api/tasks/{gate['id']}/dependencies", {"task": z["id"]}, format="json")
    assert started.status_code == 409  # it is already running (waiting for its OK)
    assert Dependency.objects.count() == 3


def test_an_edge_added_later_holds_back_a_task_that_had_not_started(box: Box, settings: Any) -> None:
    gate = held(box, title="gate")
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}  # nobody takes runs now
    later = box.create(title="later", flow=flow({"write": {"path": "l.txt", "content": "l"}}))
    assert runs_of(later["id"]) == [RunKind.START]
    added = box.api.post(f"/api/tasks/{later['id']}/dependencies", {"task": gate["id"], "condition": "completion"},
                         format="json")
    assert added.status_code == 201, added.json()
    assert added.json()["dependencies"][0]["edge"] == "waiting"
    assert Run.objects.get(task_id=later["id"]).state == "cancelled"  # held back: a worker finds nothing to claim
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": True}
    end(box, gate["id"], "done")
    box.wait_state(later["id"], "done")
    assert list(Run.objects.filter(task_id=later["id"]).order_by("number").values_list("number", "state")) == [
        (1, "cancelled"), (2, "finished")]  # numbered after the run it held back


def _run_as_made(run: Run) -> dict[str, Any]:
    return {name: value for name, value in model_to_dict(run).items()
            if name not in ("id", "task", "available_at", "enqueued_at", "created_at")}


def test_a_dependent_released_in_the_move_gets_the_run_and_note_a_creation_writes(box: Box, settings: Any) -> None:
    # The release is written once per process (``moves.release``), the creation's run by the ORM.
    gate = held(box, title="gate")
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}  # nobody takes runs now
    dependent = box.create(title="later", flow=gated(), dependsOn=[{"task": gate["id"], "condition": "completion"}])
    free = box.create(title="free", flow=gated())
    end(box, gate["id"], "cancelled")
    released, made = Run.objects.get(task_id=dependent["id"]), Run.objects.get(task_id=free["id"])
    assert _run_as_made(released) == _run_as_made(made)
    assert released.enqueued_at == released.available_at and released.created_at is not None
    logged = list(TaskEvent.objects.filter(task_id=dependent["id"]).order_by("seq").values_list("seq", "kind", "summary", "data"))
    assert [seq for seq, *_ in logged] == list(range(1, len(logged) + 1))
    assert logged[-1][1:] == (EventKind.NOTE, "its dependencies allow it to start", {"dependencies": "satisfied"})
    assert Task.objects.get(pk=dependent["id"]).event_seq == logged[-1][0]
    with transaction.atomic():  # a second wake-up in a move finds the run queued: nothing more
        services.wake_dependents(gate["id"])
    assert runs_of(dependent["id"]) == [RunKind.START]
    assert TaskEvent.objects.filter(task_id=dependent["id"]).count() == len(logged)


def test_a_lost_wakeup_is_repaired_by_the_sweep_and_a_duplicate_does_nothing(box: Box, monkeypatch: Any) -> None:
    upstream = held(box)
    dependent = box.create(title="downstream", flow=gated(), dependsOn=[upstream["id"]])
    monkeypatch.setattr(services, "wake_dependents", lambda task_id, **kw: None)  # the wake-up is lost
    end(box, upstream["id"], "done")
    assert box.task(dependent["id"])["state"] == "queued"
    monkeypatch.undo()
    assert services.release_waiting() == 1
    box.wait_state(dependent["id"], "waiting")
    services.wake_dependents(upstream["id"])  # a duplicate wake-up
    assert services.release_if_ready(dependent["id"]) is False
    assert services.release_waiting() == 0
    assert runs_of(dependent["id"]) == [RunKind.START]


def test_the_graph_in_the_api_and_on_the_task_page(box: Box, client: Any) -> None:
    upstream = held(box, title="make the report")
    dependent = box.create(title="read the report", flow=gated(), dependsOn=[
        {"task": upstream["id"], "condition": "artifact", "artifact": "outputs/report.md", "required": False}])
    graph = box.api.get(f"/api/tasks/{upstream['id']}/dependencies").json()
    assert graph["dependencies"] == []
    assert graph["dependents"] == [{"task": dependent["id"], "title": "read the report", "state": "queued",
                                    "condition": "artifact", "artifact": "outputs/report.md", "required": False,
                                    "edge": "waiting"}]
    client.force_login(box.owner)
    page = client.get(f"/tasks/{dependent['id']}").content.decode()
    assert 'id="dependency-graph"' in page and "make the report" in page and f'href="/tasks/{upstream["id"]}"' in page
    page = client.get(f"/tasks/{upstream['id']}").content.decode()
    assert "read the report" in page


@pytest.mark.skipif(not settings.DB_IS_POSTGRES, reason="concurrent transactions need PostgreSQL")
def test_concurrent_edges_never_close_a_cycle(box: Box) -> None:
    """Two requests add x->y and y->x at the same moment: exactly one is accepted."""
    gate = held(box, title="gate")
    for _ in range(5):
        x = box.create(title="x", flow=gated(), dependsOn=[gate["id"]])["id"]
        y = box.create(title="y", flow=gated(), dependsOn=[gate["id"]])["id"]
        barrier = threading.Barrier(2)
        codes: list[int] = []

        def add(task: str, on: str) -> None:
            try:
                barrier.wait()
                response = box.api.__class__()
                response.credentials(HTTP_AUTHORIZATION=f"Bearer {box.token}")
                codes.append(response.post(f"/api/tasks/{task}/dependencies", {"task": on}, format="json").status_code)
            finally:
                connection.close()

        threads = [threading.Thread(target=add, args=pair) for pair in ((x, y), (y, x))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(codes) == [201, 409], codes
        assert Dependency.objects.filter(task_id__in=[x, y], on_id__in=[x, y]).count() == 1


def test_the_dependent_reads_its_dependencys_file(box: Box) -> None:
    """A dependent's flow uses what its dependency wrote: the done layer is in its view."""
    upstream = held(box, after=[WRITE])
    dependent = box.create(title="copy", dependsOn=[upstream["id"]], flow=flow(
        {"run": "grep -q '# report' outputs/report.md"}))
    end(box, upstream["id"], "done")
    box.wait_state(dependent["id"], "done", "failed")
    assert box.task(dependent["id"])["state"] == "done", box.task(dependent["id"])["error"]


def test_a_dependent_is_queued_in_the_transaction_that_ends_its_dependency(box: Box) -> None:
    """No wake-up after commit sits between a dependency's end and its dependent's first run:
    the run is written by the move that allows it, so a crash right after that commit loses no
    wake-up (and a chain costs no extra transaction per link)."""
    upstream = held(box)
    dependent = box.create(title="downstream", flow=flow({"write": {"path": "b.txt", "content": "b"}}),
                           dependsOn=[{"task": upstream["id"], "condition": "completion"}])
    task = Task.objects.get(pk=upstream["id"])
    with transaction.atomic():
        services.transition(task, "cancelled", summary="cancelled by the test")
        assert runs_of(dependent["id"]) == [RunKind.START]  # before commit
        assert Run.objects.get(task_id=dependent["id"]).enqueued_at is not None  # sent after commit
    box.wait_state(dependent["id"], "done")


def test_a_descendant_that_also_waits_on_a_cancelled_task_is_cancelled_with_it(box: Box) -> None:
    top = held(box, title="top")
    child = box.create(title="child", flow=gated(), parent=top["id"], dependsOn=[top["id"]])
    box.api.post(f"/api/tasks/{top['id']}/cancel")
    ended = box.wait_state(child["id"], "cancelled", "failed")
    assert ended["state"] == "cancelled", ended["error"]


@pytest.mark.skipif(not settings.DB_IS_POSTGRES, reason="row locks are PostgreSQL's (SQLite serialises writers)")
def test_a_dependent_locked_elsewhere_does_not_hold_up_its_dependencys_end(box: Box) -> None:
    """The final move does not wait for a dependent's row another transaction holds (that one
    may wait for the dependency's row: a deadlock); the dependent starts once it is free."""
    upstream = held(box)
    dependent = box.create(title="downstream", flow=flow({"write": {"path": "b.txt", "content": "b"}}),
                           dependsOn=[{"task": upstream["id"], "condition": "completion"}])
    _ended_while_held(box, upstream["id"], dependent["id"],
                      lambda: list(Task.objects.select_for_update().filter(pk=dependent["id"])))


def _ended_while_held(box: Box, upstream: str, dependent: str, hold: Any) -> None:
    """Another transaction runs ``hold`` (takes a lock the dependent's decision needs) and keeps
    it while ``upstream`` is cancelled: the final move commits without waiting for it, the
    dependent is not started yet, and it starts once the lock is let go."""
    locked, release = threading.Event(), threading.Event()

    def holding() -> None:
        try:
            with transaction.atomic():
                hold()
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=holding)
    holder.start()
    try:
        assert locked.wait(30)
        ended = threading.Thread(target=lambda: (box.api.post(f"/api/tasks/{upstream}/cancel"), connection.close()))
        ended.start()
        wait_for(lambda: Task.objects.get(pk=upstream).state == "cancelled", timeout=20,
                 what="the dependency's final move to commit")
        assert runs_of(dependent) == []  # not yet: the lock is held
    finally:
        release.set()
        holder.join()
    ended.join(60)
    box.wait_state(dependent, "done")


@pytest.mark.skipif(not settings.DB_IS_POSTGRES, reason="row locks are PostgreSQL's (SQLite serialises writers)")
def test_a_dependent_whose_owners_row_is_held_does_not_hold_up_its_dependencys_end(box: Box) -> None:
    """An edge writer holds the owner's row (``dependencies.lock_owner``) and may wait for the
    dependency's row: the final move skips the dependent, which starts once the row is free."""
    upstream = held(box)
    dependent = box.create(title="downstream", flow=flow({"write": {"path": "b.txt", "content": "b"}}),
                           dependsOn=[{"task": upstream["id"], "condition": "completion"}])
    _ended_while_held(box, upstream["id"], dependent["id"], lambda: dependencies.lock_owner(box.owner.pk))


@pytest.mark.skipif(not settings.DB_IS_POSTGRES, reason="deadlock detection is PostgreSQL's (SQLite serialises writers)")
def test_a_creation_chosen_as_a_deadlocks_victim_is_tried_again_not_a_500(box: Box) -> None:
    """A creation with a dependency waits for the dependency's row (the edge's foreign key) while
    holding the settings row; another transaction holding the dependency's row then waits for
    the settings row. PostgreSQL aborts the creation: the client still gets its task."""
    upstream = held(box)
    BoxSettings.current()
    locked = threading.Event()
    crossed: list[str] = []

    def lock_waiters() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            return int(cursor.fetchone()[0])

    def hold_then_cross() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:  # the creation's check for the deadlock runs first, even under load
                    cursor.execute("SET LOCAL deadlock_timeout = '20s'")
                list(Task.objects.select_for_update().filter(pk=upstream["id"]))
                locked.set()
                wait_for(lambda: lock_waiters() > 0, timeout=30, what="the creation to wait for the dependency's row")
                list(BoxSettings.objects.select_for_update().filter(pk=1))  # the creation holds it
                crossed.append("got the settings row")
        finally:
            connection.close()

    holder = threading.Thread(target=hold_then_cross)
    holder.start()
    try:
        assert locked.wait(30)
        response = box.api.post("/api/tasks", {"title": "downstream", "flow": gated(),
                                               "dependsOn": [upstream["id"]]}, format="json")
    finally:
        holder.join(60)
    assert response.status_code == 201, response.json()
    assert crossed == ["got the settings row"]  # the other transaction went on: the creation was the victim
    assert Dependency.objects.filter(task_id=response.json()["id"], on_id=upstream["id"]).count() == 1


def test_the_worker_that_ends_a_task_runs_its_dependent_next_and_each_run_once(box: Box, settings: Any) -> None:
    """A chain does not wait for the queue at each link: the worker whose run ends a task goes on
    with the dependent that became due, held back from the queue (no second delivery to wake the
    other worker for nothing). A delivery of it anyway (the scheduler's re-send) finds it taken."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}  # nobody takes runs from the queue now
    first = box.create(title="first", flow=flow(WRITE))
    second = box.create(title="second", flow=flow({"write": {"path": "b.txt", "content": "b"}}), dependsOn=[first["id"]])
    third = box.create(title="third", flow=flow({"write": {"path": "c.txt", "content": "c"}}), dependsOn=[second["id"]])
    assert runs_of(second["id"]) == [] and runs_of(third["id"]) == []
    get_broker().purge_queue()
    jobs.execute_run(Run.objects.get(task_id=first["id"]).pk)  # one delivery, as a worker takes it
    for task in (first, second, third):
        assert box.task(task["id"])["state"] == "done"
    assert get_broker().queue_size() == 0
    for task in (second, third):
        run = Run.objects.get(task_id=task["id"])
        jobs.execute_run(run.pk)  # a delivery later: nothing to do
        assert runs_of(task["id"]) == [RunKind.START] and Run.objects.get(pk=run.pk).state == run.state == "finished"


def test_a_held_dependent_the_worker_does_not_take_goes_to_the_queue(box: Box, settings: Any) -> None:
    """Past the worker's budget for going on (a tenth of the job timeout), the held run is sent."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}
    settings.BOX_JOB_TIMEOUT_S = 0
    first = box.create(title="first", flow=flow(WRITE))
    second = box.create(title="second", flow=flow({"write": {"path": "b.txt", "content": "b"}}), dependsOn=[first["id"]])
    get_broker().purge_queue()
    jobs.execute_run(Run.objects.get(task_id=first["id"]).pk)
    run = Run.objects.get(task_id=second["id"])
    assert run.state == "queued" and get_broker().queue_size() == 1
    jobs.execute_run(run.pk)
    assert box.task(second["id"])["state"] == "done"


def test_a_held_dependent_whose_worker_died_is_sent_again_by_the_scheduler(box: Box, settings: Any, monkeypatch: Any) -> None:
    """The held run was written as sent in the finish's transaction: a worker that dies before it
    claims or sends it leaves it to ``stranded_runs``, as a message the queue lost."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}
    settings.BOX_JOB_TIMEOUT_S = 0
    first = box.create(title="first", flow=flow(WRITE))
    second = box.create(title="second", flow=flow({"write": {"path": "b.txt", "content": "b"}}), dependsOn=[first["id"]])
    get_broker().purge_queue()
    monkeypatch.setattr(worker, "_send", lambda run_id: None)  # the process died holding it
    jobs.execute_run(Run.objects.get(task_id=first["id"]).pk)
    run = Run.objects.get(task_id=second["id"])
    assert run.state == "queued" and run.enqueued_at is not None and get_broker().queue_size() == 0
    later = timezone.now() + timedelta(seconds=settings.BOX_RESEND_S + 1)
    assert runs.stranded_runs(later) == [run.pk]
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": True}
    assert runs.dispatch_due(later) == 1
    assert box.task(second["id"])["state"] == "done" and runs_of(second["id"]) == [RunKind.START]

def test_a_held_dependent_whose_run_crashed_the_job_resumes_at_once(box: Box, settings: Any, monkeypatch: Any) -> None:
    """A job that breaks while it takes the held run (claimed with the finish before) hands that
    run back: a new run is queued and sent at once, no wait for its lease to run out."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}
    first = box.create(title="first", flow=flow(WRITE))
    second = box.create(title="second", flow=flow({"write": {"path": "b.txt", "content": "b"}}), dependsOn=[first["id"]])
    get_broker().purge_queue()
    execute = worker._execute
    calls: list[int] = []

    def breaks_on_the_second(run_id: int, *args: Any) -> Any:
        calls.append(run_id)
        if len(calls) == 2:
            raise RuntimeError("the job broke")
        return execute(run_id, *args)

    monkeypatch.setattr(worker, "_execute", breaks_on_the_second)
    with pytest.raises(RuntimeError):
        jobs.execute_run(Run.objects.get(task_id=first["id"]).pk)
    handed, again = Run.objects.filter(task_id=second["id"]).order_by("number")
    assert (handed.state, handed.outcome) == ("lost", "handed back") and "job broke" in handed.error
    assert again.state == "queued" and again.enqueued_at is not None and get_broker().queue_size() == 1
    assert lifecycle.janitor.drain() and Layer.objects.get(task_id=first["id"]).sealed  # its release was not lost
    jobs.execute_run(again.pk)
    assert box.task(second["id"])["state"] == "done"


def test_the_finish_that_starts_a_dependent_claims_it_in_its_own_transaction(box: Box, settings: Any, monkeypatch: Any) -> None:
    """The worker going on with a dependent has it claimed, and its task moved to running, by the
    finish that released it: a chain's link commits once for both, no claim of its own."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}
    first = box.create(title="first", flow=flow(WRITE))
    second = box.create(title="second", flow=flow({"write": {"path": "b.txt", "content": "b"}}), dependsOn=[first["id"]])
    third = box.create(title="third", flow=flow({"write": {"path": "c.txt", "content": "c"}}), dependsOn=[second["id"]])
    get_broker().purge_queue()
    claims: list[int] = []
    begin = worker.begin_run
    monkeypatch.setattr(worker, "begin_run", lambda run_id: claims.append(run_id) or begin(run_id))
    finished_at: dict[str, Any] = {}
    finish = worker.finish_run

    def seen_at_the_finish(task: Task, *args: Any, **kwargs: Any) -> Any:
        done = finish(task, *args, **kwargs)
        if done.claimed is not None:  # committed: the dependent is running already
            claimed = done.claimed[0]
            finished_at[task.pk] = (Task.objects.get(pk=claimed.task_id).state, Run.objects.get(pk=claimed.pk).state)
        return done

    monkeypatch.setattr(worker, "finish_run", seen_at_the_finish)
    jobs.execute_run(Run.objects.get(task_id=first["id"]).pk)
    assert claims == [Run.objects.get(task_id=first["id"]).pk]  # only the job's own run went through ``begin_run``
    assert finished_at == {first["id"]: ("running", "running"), second["id"]: ("running", "running")}
    for task in (first, second, third):
        assert box.task(task["id"])["state"] == "done" and runs_of(task["id"]) == [RunKind.START]
    summaries = [e.summary for e in TaskEvent.objects.filter(task_id=second["id"]).order_by("seq")]
    released = summaries.index("its dependencies allow it to start")
    assert summaries[released + 1] == "running" and summaries[released + 2].startswith("isolation: ")


def test_a_dependent_whose_claim_fails_in_the_finish_is_claimed_after_it(box: Box, settings: Any, monkeypatch: Any,
                                                                        caplog: Any) -> None:
    """The claim with the finish is in a savepoint of its own: one that fails leaves the finish
    whole (the task done, its dependent released), and the worker claims the run after it."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}
    first = box.create(title="first", flow=flow(WRITE))
    second = box.create(title="second", flow=flow({"write": {"path": "b.txt", "content": "b"}}), dependsOn=[first["id"]])
    get_broker().purge_queue()
    claim = finalize._claim_and_begin
    failed: list[int] = []

    def fails_inside_a_transaction_it_did_not_open(run_id: int, **kwargs: Any) -> Any:
        claimed = claim(run_id, **kwargs)  # its writes are made, then undone with the savepoint
        if connection.in_atomic_block and not failed and Task.objects.filter(pk=second["id"], state="running").exists():
            failed.append(run_id)
            raise RuntimeError("the claim broke")
        return claimed

    monkeypatch.setattr(finalize, "_claim_and_begin", fails_inside_a_transaction_it_did_not_open)
    jobs.execute_run(Run.objects.get(task_id=first["id"]).pk)
    assert "the claim broke" in caplog.text
    for task in (first, second):
        assert box.task(task["id"])["state"] == "done" and runs_of(task["id"]) == [RunKind.START]
    moves = [e.data["to"] for e in TaskEvent.objects.filter(task_id=second["id"], kind=EventKind.STATUS).order_by("seq")]
    assert moves == ["queued", "running", "done"]  # the undone claim's move left nothing behind


def test_a_stop_after_the_finish_claimed_a_dependent_takes_no_further_run(box: Box, settings: Any,
                                                                         monkeypatch: Any) -> None:
    """A stop that comes after the finish claimed the dependent: that run goes on as one just
    claimed (its step ends, or it is handed back), and its own finish claims nothing more: the
    next link's run is sent to the queue, to be taken at the next start."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}
    first = box.create(title="first", flow=flow(WRITE))
    second = box.create(title="second", flow=flow({"write": {"path": "b.txt", "content": "b"}}), dependsOn=[first["id"]])
    third = box.create(title="third", flow=flow({"write": {"path": "c.txt", "content": "c"}}), dependsOn=[second["id"]])
    get_broker().purge_queue()
    finish = worker.finish_run
    claimed: dict[str, bool] = {}

    def stop_after_the_first(task: Task, *args: Any, **kwargs: Any) -> Any:
        done = finish(task, *args, **kwargs)
        claimed[task.title] = done.claimed is not None
        if task.pk == first["id"]:
            worker.handing_back.set()  # the cluster's SIGUSR1 (``hand_back_on_signal``)
        return done

    monkeypatch.setattr(worker, "finish_run", stop_after_the_first)
    try:
        jobs.execute_run(Run.objects.get(task_id=first["id"]).pk)
    finally:
        worker.handing_back.clear()
    assert claimed == {"first": True, "second": False}
    assert box.task(first["id"])["state"] == box.task(second["id"])["state"] == "done"
    waiting = Run.objects.get(task_id=third["id"])
    assert waiting.state == "queued" and get_broker().queue_size() == 1
    jobs.execute_run(waiting.pk)
    assert box.task(third["id"])["state"] == "done"


def test_the_worker_opens_the_dependents_view_before_its_janitor_releases_the_task_before(
        box: Box, settings: Any, monkeypatch: Any) -> None:
    """The worker that goes on with a dependent opens its view first, which seals the ended task's
    layer itself: the janitor's release of that task beside it only took turns with it at the
    interpreter and waited on the same lock. The release is handed over right after; with no
    dependent to go on with, at once."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}
    first = box.create(title="first", flow=flow(WRITE))
    second = box.create(title="second", flow=flow({"write": {"path": "b.txt", "content": "b"}}), dependsOn=[first["id"]])
    get_broker().purge_queue()
    order: list[tuple[str, str]] = []
    prepare, submit = lifecycle.prepare, lifecycle.janitor.submit
    monkeypatch.setattr(lifecycle, "prepare", lambda task: order.append(("opened", task.pk)) or prepare(task))
    monkeypatch.setattr(lifecycle.janitor, "submit", lambda job, then=None: order.append(("released", job)) or submit(job, then))

    jobs.execute_run(Run.objects.get(task_id=first["id"]).pk)

    assert [step for step in order if step[1] in (first["id"], second["id"])] == [
        ("opened", first["id"]), ("opened", second["id"]), ("released", first["id"]), ("released", second["id"])]
    assert lifecycle.janitor.drain()
    assert box.task(second["id"])["state"] == "done" and Layer.objects.get(task_id=first["id"]).sealed
