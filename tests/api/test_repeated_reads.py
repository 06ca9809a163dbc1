"""What one request or one task's end costs the database: the settings row and the vault read once
per request, an event numbered in one statement, nothing to close when nothing is open."""
from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from boxsite.core import reads
from boxsite.models import BoxSettings
from tasks.events import record_event
from tasks.models import EventKind, Task
from tasks.vault.facts import Facts, vault_values
from tasks.vault.store import delete_secret, set_secret
from tests.conftest import Box, queue_through_the_cluster
from tests.factories import flow

SECRET = "sk-live-once-per-request-9f3e"
TRIVIAL = flow({"write": {"path": "a.txt", "content": "a"}})


def _touching(queries: CaptureQueriesContext, table: str) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if table in q["sql"]]


def test_creating_a_task_reads_the_settings_row_once_under_its_lock(box: Box, settings: Any) -> None:
    queue_through_the_cluster(settings)
    box.create(title="first", flow=TRIVIAL)  # the settings row exists from here on
    with CaptureQueriesContext(connection) as queries:
        box.create(title="second", flow=TRIVIAL)
    read = _touching(queries, "boxsite_boxsettings")
    assert len(read) == 1, read
    if connection.features.has_select_for_update:  # the capacity check holds the row (PostgreSQL)
        assert "FOR UPDATE" in read[0].upper(), read


def test_the_locked_settings_row_is_the_row_the_orm_reads(box: Box) -> None:
    BoxSettings.objects.filter(pk=1).delete()
    with transaction.atomic():
        made = BoxSettings.locked()  # the first creation makes the row
    assert made.pk == 1 and BoxSettings.objects.count() == 1
    BoxSettings.objects.filter(pk=1).update(network_default="allowlist", default_hosts=["api.example.org"],
                                            max_active_tasks=7)
    with transaction.atomic():
        locked = BoxSettings.locked()
    expected = BoxSettings.objects.get(pk=1)
    fields = BoxSettings._meta.concrete_fields
    assert [getattr(locked, f.attname) for f in fields] == [getattr(expected, f.attname) for f in fields]
    assert locked.default_hosts == ["api.example.org"] and locked.updated_at is not None
    assert not locked._state.adding


def test_a_page_of_tasks_reads_the_vault_once(box: Box, settings: Any) -> None:
    queue_through_the_cluster(settings)
    set_secret("SOME_KEY", SECRET)
    for n in range(3):
        box.create(title=f"task {n}", flow=TRIVIAL, facts={"note": f"uses {SECRET}"})
    box.api.get("/api/tasks")
    with CaptureQueriesContext(connection) as queries:
        page = box.api.get("/api/tasks").json()
    assert len(page["results"]) == 3
    assert SECRET not in str(page)
    assert len(_touching(queries, "boxsite_vaultsecret")) == 1, _touching(queries, "boxsite_vaultsecret")


def test_a_vault_write_is_seen_by_the_rest_of_its_request(db: Any) -> None:
    with reads.read_once():
        assert "LATE_KEY" not in vault_values()
        set_secret("LATE_KEY", SECRET)
        assert Facts.build({}).redactor().text(f"the key is {SECRET}") == "the key is ${LATE_KEY}"
        delete_secret("LATE_KEY")
        assert "LATE_KEY" not in vault_values()


def test_a_settings_save_is_seen_by_the_rest_of_its_request(db: Any) -> None:
    with reads.read_once():
        row = BoxSettings.current()
        BoxSettings.objects.filter(pk=row.pk).update(max_active_tasks=7)
        assert BoxSettings.current().max_active_tasks == row.max_active_tasks  # held: read once
        row.max_active_tasks = 9
        row.save()
        assert BoxSettings.current().max_active_tasks == 9
    assert BoxSettings.current().max_active_tasks == 9  # outside a scope: read each time


def test_an_event_is_numbered_and_written_in_two_statements(box: Box, settings: Any) -> None:
    queue_through_the_cluster(settings)
    task = Task.objects.get(pk=box.create(title="numbered", flow=TRIVIAL)["id"])
    redactor = Facts.of(task).redactor()
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        first = record_event(task, EventKind.NOTE, "one", redactor=redactor)
        second = record_event(task, EventKind.NOTE, "two", redactor=redactor)
    assert second.seq == first.seq + 1 == task.event_seq
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 4, statements
    assert Task.objects.get(pk=task.pk).event_seq == second.seq


def test_a_task_ending_with_nothing_open_closes_no_approval_question_or_action(box: Box, settings: Any) -> None:
    queue_through_the_cluster(settings)
    task = box.create(title="to cancel", flow=TRIVIAL)
    with CaptureQueriesContext(connection) as queries:
        assert box.api.post(f"/api/tasks/{task['id']}/cancel").status_code == 200
    writes = [sql for sql in queries.captured_queries if sql["sql"].startswith('UPDATE "approvals_')]
    assert writes == []
    assert box.task(task["id"])["state"] == "cancelled"
