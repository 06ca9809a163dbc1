"""What one trivial run costs the database, counted in process: a guard against the
statements creeping back, and the vault read it saves without missing a secret added mid-run."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.conf import settings as box_settings
from django.db import connection, transaction
from django.db.backends.signals import connection_created
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext

from boxsite.core import background
from tasks.jobs import execute_run
from tasks.layers import task_view
from tasks.models import EventKind, Layer, Run, Task, TaskEvent, VaultSecret, Workspace
from tasks.run import leases as runs
from tasks.run import lifecycle
from tasks.run.finish import begin_run, finish_run
from tasks.run.recorder import ACTIONS, LeaseLost, LimitReached, StepRecorder
from tasks.vault.facts import Facts, refreshed
from tasks.vault.store import set_secret
from tasks.workers.base import Done, Failed
from tests.conftest import Box, queue_through_the_cluster, wait_for
from tests.factories import flow
from tests.layers.conftest import no_seal_beside_the_finish

TRIVIAL = flow({"write": {"path": "a.txt", "content": "a"}})
# Statements one trivial run executes in the worker's own thread, from its claim to its finish,
# the opening of its view (its layer row and stack) included; the queue's own statements and the
# release (the janitor's thread) are not counted. SQLite counts its BEGIN IMMEDIATE and COMMIT;
# PostgreSQL its row locks (``runs.lock_task``).
MOST = {"sqlite": 37, "postgresql": 20}
LATE = "sk-live-added-while-it-ran-7c1d"


# Statements each further write step adds to a run (BEGIN and COMMIT included): its start (the
# counted action, "Doing now", the event) and its result with the resume point past it, each a
# write that proves the run's lease. On PostgreSQL each is one statement that writes nothing
# unless the lease holds, so it is sent alone, without a transaction around it, its action counted
# from the row as the run last wrote it (``events.record_numbered_event``, ``StepRecorder.event``).
PER_STEP = {"sqlite": 11, "postgresql": 2}

# Statements of a run's finish that ends its task and so starts its dependent's first run: the
# vault's stamp, then one transaction (the task read again and locked, the run closed, which
# proves its lease, the move and its cleanup, the dependents looked for) and, in a savepoint of
# its own, the dependent's decision (its owner's row and its own locked, its edges, the note and
# the run). The vault's stamp is read once for the whole finish, the dependent's note included.
FINISH_STARTING = {"sqlite": 18, "postgresql": 15}


def run_counted(box: Box, settings: Any, flow_body: dict[str, Any] = TRIVIAL, **spec: Any) -> tuple[str, list[str]]:
    """Create a task (its run queued, not executed), then execute its run here, counting."""
    queue_through_the_cluster(settings)
    task = box.create(title="counted", flow=flow_body, **spec)
    run_id = Run.objects.get(task_id=task["id"]).pk
    with CaptureQueriesContext(connection) as queries:
        execute_run(run_id)
    return task["id"], [q["sql"] for q in queries.captured_queries]


def test_a_trivial_run_executes_no_more_statements_than_counted(box: Box, settings: Any) -> None:
    task_id, statements = run_counted(box, settings)
    assert box.task(task_id)["state"] == "done"
    assert len(statements) <= MOST[connection.vendor], "\n".join(statements)


def test_a_trivial_run_reads_its_workspace_with_its_claim(box: Box, settings: Any) -> None:
    task_id, statements = run_counted(box, settings)
    assert box.task(task_id)["state"] == "done"
    assert not [s for s in statements if s.startswith("SELECT") and 'FROM "tasks_workspace"' in s], statements
    claimed = runs.claim(_queued_run(box, settings))
    assert claimed is not None
    task = claimed[0].task
    assert model_to_dict(task.workspace) == model_to_dict(Workspace.objects.get(pk=task.workspace_id))


def _queued_run(box: Box, settings: Any) -> int:
    queue_through_the_cluster(settings)
    return Run.objects.get(task_id=box.create(title="queued", flow=TRIVIAL)["id"]).pk


def test_each_further_step_executes_no_more_statements_than_counted(box: Box, settings: Any) -> None:
    one_id, one = run_counted(box, settings)
    six_id, six = run_counted(box, settings, flow(*({"write": {"path": f"s{i}.txt", "content": "s"}} for i in range(6))))
    assert box.task(one_id)["state"] == box.task(six_id)["state"] == "done"
    assert (len(six) - len(one)) / 5 <= PER_STEP[connection.vendor], "\n".join(six)


def test_a_finish_that_starts_a_dependent_executes_no_more_statements_than_counted(box: Box, settings: Any) -> None:
    task, run, token = _claimed(box, settings, "dependency")
    dependent = box.create(title="dependent", flow=TRIVIAL, dependsOn=[task.pk])
    recorder = StepRecorder(task, run.pk, token, Facts.of(task).redactor())
    with CaptureQueriesContext(connection) as queries:
        finished = finish_run(task, run, token, recorder, Done("done"), 5, hand_over=True)
    lifecycle.submit_held(finished.releases)
    statements = [q["sql"] for q in queries.captured_queries]
    assert finished.held == Run.objects.get(task_id=dependent["id"], state="queued").pk
    assert len(statements) <= FINISH_STARTING[connection.vendor], "\n".join(statements)


# The same finish with the worker going on (``claim_next``): in the same transaction, a savepoint
# around the dependent's claim and move to running (``begin_run``'s statements less its
# transaction, its vault read (the finish's) and its lock of the task's row, which the decision
# took), not a transaction of its own.
FINISH_CLAIMING = {"sqlite": 25, "postgresql": 19}


def test_a_finish_that_claims_its_dependent_executes_no_more_statements_than_counted(box: Box, settings: Any) -> None:
    task, run, token = _claimed(box, settings, "dependency")
    dependent = box.create(title="dependent", flow=TRIVIAL, dependsOn=[task.pk])
    recorder = StepRecorder(task, run.pk, token, Facts.of(task).redactor())
    with CaptureQueriesContext(connection) as queries:
        finished = finish_run(task, run, token, recorder, Done("done"), 5, hand_over=True, claim_next=True)
    lifecycle.submit_held(finished.releases)
    statements = [q["sql"] for q in queries.captured_queries]
    assert finished.claimed is not None and finished.held == finished.claimed.run.pk
    assert Run.objects.get(pk=finished.held).state == "running" and box.task(dependent["id"])["state"] == "running"
    assert len(statements) <= FINISH_CLAIMING[connection.vendor], "\n".join(statements)


def test_a_plain_finish_whose_lease_was_taken_over_writes_nothing(box: Box, settings: Any) -> None:
    # Its lease is proven by the run's close (``runs.finish``), not by a heartbeat before it.
    task, run, token = _claimed(box, settings, "taken over")
    dependent = box.create(title="dependent", flow=TRIVIAL, dependsOn=[task.pk])
    recorder = StepRecorder(task, run.pk, token, Facts.of(task).redactor())
    Run.objects.filter(pk=run.pk).update(lease_token="taken-over")
    before = Task.objects.get(pk=task.pk)
    with pytest.raises(LeaseLost):
        finish_run(task, run, token, recorder, Done("done"), 5)
    after = Task.objects.get(pk=task.pk)
    assert (after.state, after.version, after.event_seq, after.spent) == ("running", before.version, before.event_seq, before.spent)
    assert Run.objects.filter(pk=run.pk, state="running", lease_token="taken-over", finished_at=None).exists()
    assert not Run.objects.filter(task_id=dependent["id"]).exists()


def test_a_trivial_run_reads_the_vault_stamp_at_most_twice_and_looks_for_dependents_once(box: Box, settings: Any) -> None:
    task_id, statements = run_counted(box, settings)
    assert box.task(task_id)["state"] == "done"
    assert len([s for s in statements if "boxsite_vaultsecret" in s]) <= 2  # the claim, the finish
    # the start's stack reads the task's own edges (a dependency's layer is stacked even while it
    # seals): that is not a look for dependents
    assert len([s for s in statements if "tasks_dependency" in s and '"tasks_layer"' not in s]) == 1


def test_a_secret_added_to_the_vault_while_a_run_ran_is_masked_in_its_outcome(box: Box, settings: Any) -> None:
    task, run, token = _claimed(box, settings, "late secret")
    recorder = StepRecorder(task, run.pk, token, Facts.of(task).redactor())
    set_secret("LATE_KEY", LATE)  # after the run's redactor was built
    finish_run(task, run, token, recorder, Failed(f"the step printed {LATE}", recoverable=False), 5)
    view = box.task(task.pk)
    assert view["state"] == "failed"
    assert LATE not in str(view)
    logged = list(TaskEvent.objects.filter(task_id=task.pk).values_list("summary", "data"))
    assert LATE not in str(logged)
    assert any("${LATE_KEY}" in summary for summary, _ in logged if summary)
    assert TaskEvent.objects.filter(task_id=task.pk, kind=EventKind.ERROR).exists()


def test_a_redactor_is_built_again_only_when_the_vault_changed(db: Any) -> None:
    redactor = Facts.build({"note": "x"}).redactor()
    assert refreshed(redactor) is redactor
    assert Facts.build({"note": "x"}).redactor() is redactor
    set_secret("LATE_KEY", LATE)
    fresh = refreshed(redactor)
    assert fresh.text(f"key {LATE}") == "key ${LATE_KEY}"
    set_secret("LATE_KEY", "sk-replaced-value-0b9e")  # same count, same highest id
    assert refreshed(fresh).text("sk-replaced-value-0b9e") == "${LATE_KEY}"
    set_secret("OTHER_KEY", "sk-other-value-51aa")
    VaultSecret.objects.filter(name="LATE_KEY").delete()  # as many secrets as before the other
    assert refreshed(fresh).text("sk-replaced-value-0b9e") == "sk-replaced-value-0b9e"


def test_a_worker_keeps_its_database_connection_from_one_run_to_the_next(box: Box, settings: Any) -> None:
    # A new connection costs CPU on SQLite too: a worker that let go of it would pay that several
    # times per run.
    run_counted(box, settings)
    kept = connection.connection
    task_id, _ = run_counted(box, settings)
    assert box.task(task_id)["state"] == "done"
    assert kept is not None and connection.connection is kept


def test_the_janitor_keeps_its_database_connection_from_one_release_to_the_next(box: Box, settings: Any) -> None:
    # In a chain of tasks a release comes every few tens of milliseconds: a connection made for
    # each (and, on PostgreSQL, a server process started for it) costs more than its statements.
    made: list[Any] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "box-janitor":
            made.append(connection)

    run_counted(box, settings)
    assert lifecycle.janitor.drain()  # a drain lets go of the janitor's connection
    connection_created.connect(count)
    try:
        for _ in range(3):
            run_counted(box, settings)
            assert lifecycle.janitor.wait_idle()
    finally:
        connection_created.disconnect(count)
    assert len(made) == 1  # made again after the drain, then kept


def test_an_idle_janitor_lets_go_of_its_database_connection(box: Box, settings: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(background, "IDLE_CONNECTION_S", 0.2)
    made: list[Any] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "box-janitor":
            made.append(connection)

    assert lifecycle.janitor.drain()
    connection_created.connect(count)
    try:
        run_counted(box, settings)
        wait_for(lambda: made and made[0].connection is None, timeout=10, what="the janitor's connection closed")
    finally:
        connection_created.disconnect(count)


def test_a_job_whose_kept_connection_was_cut_off_claims_its_run_on_a_fresh_one(box: Box, settings: Any) -> None:
    # The job's first statement goes without a health check (``tasks.jobs``): the claim retries.
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no server to cut a connection off")
    run_counted(box, settings)
    created = box.create(title="cut off", flow=TRIVIAL)
    run_id = Run.objects.get(task_id=created["id"]).pk
    kept = connection.connection
    assert kept is not None
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (kept.info.backend_pid,))
    execute_run(run_id)
    assert connection.connection is not kept
    assert box.task(created["id"])["state"] == "done"


def test_the_start_logs_its_move_then_its_isolation_numbered_by_the_moves_own_update(box: Box, settings: Any) -> None:
    task_id, statements = run_counted(box, settings)
    logged = list(TaskEvent.objects.filter(task_id=task_id).order_by("seq").values_list("seq", "kind", "summary"))
    assert [seq for seq, _, _ in logged] == list(range(1, len(logged) + 1))  # no gap, no duplicate
    running = next(i for i, (_, kind, summary) in enumerate(logged) if kind == EventKind.STATUS and summary == "running")
    assert logged[running + 1][1:] == (EventKind.NOTE, logged[running + 1][2])
    assert logged[running + 1][2].startswith("isolation: ")
    assert Task.objects.get(pk=task_id).event_seq == logged[-1][0]
    claim = next(i for i, sql in enumerate(statements) if "lease_token" in sql and sql.startswith(("UPDATE", 'WITH "taken"')))
    numbered = [sql for sql in statements[claim + 1:] if "RETURNING" in sql and "event_seq" in sql]
    # the move to running takes both its numbers; then the step, its result and the move to done
    assert len(numbered) == 4, "\n".join(numbered)
    assert "'running'" in numbered[0] and '"event_seq" + 2' in numbered[0]


def test_a_seal_reads_its_rows_in_one_statement_and_writes_them_in_one(box: Box, settings: Any, monkeypatch: Any) -> None:
    # A dependent's start seals the layer of the task before it (``task_view.seal_layer``); the
    # seal once read the task, the layer and the ids of every layer applied within a lease.
    monkeypatch.setattr(lifecycle, "release_soon", lambda task_id, then=None, handover=None: None)  # the seal left to the test
    no_seal_beside_the_finish(monkeypatch)  # nor begun beside the finish
    for _ in range(3):
        run_counted(box, settings)  # layers applied within the lease, in the stack of the next
    task_id, _ = run_counted(box, settings, flow({"write": {"path": "b.txt", "content": "b"}}))
    assert not Layer.objects.get(task_id=task_id).sealed
    with CaptureQueriesContext(connection) as queries:
        task_view.seal_layer(task_id)
    statements = [q["sql"] for q in queries.captured_queries]
    layer = Layer.objects.get(task_id=task_id)
    assert layer.sealed and layer.manifest["paths"] == [{"path": "b.txt", "kind": "added"}] and not layer.note_due
    assert len(statements) == 2, "\n".join(statements)
    for earlier in Task.objects.exclude(pk=task_id).values_list("pk", flat=True):
        lifecycle.release(earlier)
    lifecycle.release(task_id)


def test_a_release_reads_its_task_without_ordering_it(box: Box, settings: Any) -> None:
    task_id, _ = run_counted(box, settings)
    lifecycle.janitor.drain()
    with CaptureQueriesContext(connection) as queries:
        lifecycle.release(task_id)  # idempotent: again, as start-up reconcile would
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT") and '"tasks_task"' in q["sql"]]
    assert reads and not [sql for sql in reads if "ORDER BY" in sql], reads  # a ``first()`` orders and slices


def test_a_release_whose_override_note_is_not_due_reads_no_other_layer(box: Box, settings: Any) -> None:
    # The seal writes whether the note is due; a release looked for the notes' layers each time.
    run_counted(box, settings)
    task_id, _ = run_counted(box, settings)
    lifecycle.janitor.drain()
    assert not Layer.objects.get(task_id=task_id).note_due
    with CaptureQueriesContext(connection) as queries:
        lifecycle.release(task_id)
    assert not [q["sql"] for q in queries.captured_queries if '"applied_at" >=' in q["sql"]]


def _claimed(box: Box, settings: Any, title: str) -> tuple[Task, Run, str]:
    """A trivial task whose start run this test claimed (the cluster's first move, done here)."""
    queue_through_the_cluster(settings)
    created = box.create(title=title, flow=TRIVIAL)
    begun = begin_run(Run.objects.get(task_id=created["id"]).pk)
    assert begun is not None
    run, token, go, _ = begun
    assert go
    return Task.objects.get(pk=created["id"]), run, token


def _recorder(box: Box, settings: Any) -> tuple[Task, StepRecorder]:
    task, run, token = _claimed(box, settings, "recorded")
    set_secret("STEP_KEY", LATE)
    return task, StepRecorder(task, run.pk, token, Facts.of(task).redactor())


def test_a_steps_write_and_its_event_are_recorded_together_at_the_next_number(box: Box, settings: Any) -> None:
    task, recorder = _recorder(box, settings)
    before = Task.objects.get(pk=task.pk).event_seq
    recorder.event(EventKind.STEP, f"step 1/1 uses {LATE}", {"key": LATE}, artifacts=[{"name": LATE}], doing_now=True,
                   progress=0.5, counts=ACTIONS)
    row = Task.objects.get(pk=task.pk)
    event = TaskEvent.objects.get(task_id=task.pk, seq=before + 1)
    assert row.event_seq == before + 1 == recorder.task.event_seq
    assert (event.kind, event.summary, event.data, event.artifacts) == (
        EventKind.STEP, "step 1/1 uses ${STEP_KEY}", {"key": "${STEP_KEY}"}, [{"name": "${STEP_KEY}"}])
    assert row.step == "step 1/1 uses ${STEP_KEY}" and row.progress == 0.5 and row.spent["actions"] == 1


def test_a_step_recorded_after_its_lease_was_taken_over_leaves_nothing_behind(box: Box, settings: Any) -> None:
    task, recorder = _recorder(box, settings)
    before = Task.objects.get(pk=task.pk)
    Run.objects.filter(pk=recorder.run_id).update(lease_token="taken-over")
    with pytest.raises(LeaseLost):
        recorder.event(EventKind.STEP, "step 1/1", doing_now=True, progress=0.5, counts=ACTIONS)
    after = Task.objects.get(pk=task.pk)
    assert (after.event_seq, after.step, after.progress, after.spent) == (before.event_seq, before.step, before.progress, before.spent)
    assert not TaskEvent.objects.filter(task_id=task.pk, seq__gt=before.event_seq).exists()


def _waiting_for_a_row_lock() -> bool:
    """A session of this test's database waits for a lock (another test worker's has its own).
    Asked inside a transaction, which would keep its first look at the sessions: cleared each time."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
        return bool(cursor.fetchone()[0])


def _step_while_the_row_is_held(recorder: StepRecorder, change: Callable[[], None]) -> tuple[BaseException | None, list[str]]:
    """Record a counted step while another transaction holds the task's row; once the step waits
    for it, that one makes ``change`` and commits. What the step raised, if anything, and its
    statements."""
    held, raised, statements = threading.Event(), [], []

    def holder() -> None:
        try:
            with transaction.atomic():
                list(Task.objects.select_for_update().filter(pk=recorder.task.pk))
                held.set()
                wait_for(_waiting_for_a_row_lock, timeout=30, what="the step to wait for the task's row")
                change()
        finally:
            connection.close()

    def step() -> None:
        try:
            with CaptureQueriesContext(connection) as queries:
                try:
                    recorder.step("step 1/1", counts=ACTIONS)
                except BaseException as exc:  # noqa: BLE001 - handed to the test
                    raised.append(exc)
            statements.extend(q["sql"] for q in queries.captured_queries)
        finally:
            connection.close()

    holding = threading.Thread(target=holder)
    holding.start()
    assert held.wait(30)
    stepping = threading.Thread(target=step)
    stepping.start()
    holding.join(60)
    stepping.join(60)
    return (raised[0] if raised else None), statements


def _waited_in_a_transaction(statements: list[str]) -> bool:
    """The step's write, sent alone, found the row held (``NOWAIT``) and waited for it in a
    transaction: a worker that dies meanwhile has its write undone, never committed late."""
    alone = [i for i, sql in enumerate(statements) if "FOR UPDATE NOWAIT" in sql]
    begun = [i for i, sql in enumerate(statements) if sql == "BEGIN"]
    return bool(alone and begun and alone[0] < begun[0] and "FOR UPDATE)" in statements[begun[0] + 1])


@pytest.mark.skipif(not box_settings.DB_IS_POSTGRES, reason="row locks are PostgreSQL's (SQLite serialises writers)")
def test_a_step_whose_lease_is_taken_while_it_waits_for_the_task_row_writes_nothing(box: Box, settings: Any) -> None:
    # The step's statement takes the task's row before the run's (the one lock order: the run's
    # row is free while it waits), and reads the run as last committed once the task's row is
    # held: a cancel that held the row is seen.
    task, recorder = _recorder(box, settings)
    before = Task.objects.get(pk=task.pk)

    def cancel() -> None:
        assert list(Run.objects.select_for_update(nowait=True).filter(pk=recorder.run_id).values_list("pk", flat=True))
        Run.objects.filter(pk=recorder.run_id).update(state="cancelled", lease_token="")

    raised, statements = _step_while_the_row_is_held(recorder, cancel)
    assert isinstance(raised, LeaseLost), raised
    assert _waited_in_a_transaction(statements), statements
    after = Task.objects.get(pk=task.pk)
    assert (after.event_seq, after.step, after.spent) == (before.event_seq, before.step, before.spent)
    assert not TaskEvent.objects.filter(task_id=task.pk, seq__gt=before.event_seq).exists()


@pytest.mark.skipif(not box_settings.DB_IS_POSTGRES, reason="row locks are PostgreSQL's (SQLite serialises writers)")
def test_a_step_counted_while_another_writer_holds_the_row_counts_from_what_it_wrote(box: Box, settings: Any) -> None:
    task, recorder = _recorder(box, settings)
    before = Task.objects.get(pk=task.pk)
    raised, statements = _step_while_the_row_is_held(recorder, lambda: Task.objects.filter(pk=task.pk).update(
        spent={**task.spent, "actions": 5}))
    assert raised is None, raised
    assert _waited_in_a_transaction(statements), statements
    after = Task.objects.get(pk=task.pk)
    assert after.spent["actions"] == 6 == recorder.task.spent["actions"]
    assert after.event_seq == before.event_seq + 1 and after.step == "step 1/1"


def test_an_action_counted_after_another_writer_changed_spent_counts_from_the_row(box: Box, settings: Any) -> None:
    # On PostgreSQL the count is written only if ``spent`` is still as the run last wrote it.
    task, recorder = _recorder(box, settings)
    Task.objects.filter(pk=task.pk).update(spent={**task.spent, "actions": 5})  # behind the recorder's back
    recorder.step("step 1/1", counts=ACTIONS)
    assert Task.objects.get(pk=task.pk).spent["actions"] == 6 == recorder.task.spent["actions"]


def test_a_limit_lowered_while_a_run_ran_stops_its_next_counted_action(box: Box, settings: Any) -> None:
    task, recorder = _recorder(box, settings)
    recorder.step("step 1/2", counts=ACTIONS)
    before = Task.objects.get(pk=task.pk)
    Task.objects.filter(pk=task.pk).update(limits={**task.limits, "max_actions": 1})  # behind the recorder's back
    with pytest.raises(LimitReached):
        recorder.step("step 2/2", counts=ACTIONS)
    after = Task.objects.get(pk=task.pk)
    assert (after.spent, after.event_seq) == (before.spent, before.event_seq)


def test_after_its_limits_changed_a_run_counts_again_without_the_locked_read(box: Box, settings: Any) -> None:
    # On PostgreSQL a counted action is written only if ``spent`` and ``limits`` are as the run last
    # saw them; once a locked read saw the changed limits, the next count needs no locked read.
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's write lock is taken by the transaction's BEGIN: every count reads the row")
    task, recorder = _recorder(box, settings)
    Task.objects.filter(pk=task.pk).update(limits={**task.limits, "max_actions": 50})  # behind the recorder's back
    recorder.step("step 1/2", counts=ACTIONS)  # counted again from the locked row
    with CaptureQueriesContext(connection) as queries:
        recorder.step("step 2/2", counts=ACTIONS)
    statements = [q["sql"] for q in queries.captured_queries]
    assert not [sql for sql in statements if sql.startswith("SELECT") and "FOR UPDATE" in sql.upper()], statements
    assert len(statements) == 1, statements  # the write alone: no transaction around it
    assert Task.objects.get(pk=task.pk).spent["actions"] == 2
