"""SQLite's writers queue on the writer gate (boxsite.core.db.sqlite), not in SQLite's busy handler."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone
from django_q.models import OrmQ

from boxsite.core.db.sqlite.base import Gate

pytestmark = pytest.mark.skipif(settings.DB_IS_POSTGRES, reason="the writer gate is the SQLite backend's")


def _wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def _someone_waits_at_the_gate() -> bool:
    return any(thread.name == "sqlite-writer-gate" for thread in threading.enumerate())


def _job(key: str) -> OrmQ:
    return OrmQ.objects.create(key=key, payload="x", lock=timezone.now())


def _in_thread(write: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    """Run ``write`` on a connection of its own that never sleeps in SQLite's busy handler: if
    it met SQLite's lock held, it would fail at once with "database is locked"."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA busy_timeout = 0")
            write()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


@pytest.mark.django_db(transaction=True)
def test_a_second_writer_waits_at_the_gate_and_goes_on_after_the_first_commits():
    def write() -> None:
        with transaction.atomic():
            _job("second")

    with transaction.atomic():
        _job("first")
        thread, errors = _in_thread(write)
        _wait_until(_someone_waits_at_the_gate)
    thread.join(20)

    assert not thread.is_alive() and errors == []
    assert list(OrmQ.objects.order_by("id").values_list("key", flat=True)) == ["first", "second"]


@pytest.mark.django_db(transaction=True)
def test_a_write_outside_a_transaction_waits_at_the_gate_too():
    _job("first")

    def write() -> None:
        OrmQ.objects.filter(key="first").update(key="updated")

    with transaction.atomic():
        OrmQ.objects.filter(key="first").update(payload="held")
        thread, errors = _in_thread(write)
        _wait_until(_someone_waits_at_the_gate)
    thread.join(20)

    assert not thread.is_alive() and errors == []
    assert list(OrmQ.objects.values_list("key", "payload")) == [("updated", "held")]


def test_a_writer_that_waited_past_its_timeout_gives_up_and_leaves_the_gate_free(tmp_path):
    path = str(tmp_path / "db-gate")
    holder = Gate(path)
    holder.acquire(1)

    with pytest.raises(OperationalError, match="database is locked"):
        Gate(path).acquire(0.05)
    holder.release()

    later = Gate(path)
    later.acquire(20)  # the abandoned wait's helper let the lock go
    assert later.held
    later.release()
