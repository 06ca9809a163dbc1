"""Every allowed and every illegal move, and races between movers."""
from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import close_old_connections, connection

from boxsite.core.errors import Conflict
from tasks import services
from tasks.models import Task, TaskEvent
from tasks.states import ALLOWED, REVIEW_MOVES, Review, State

ALL = list(State)
MOVES = [(old, new) for old in ALL for new in ALL]


def _task_in(box, state: str) -> Task:
    view = box.create(title=f"in {state}", flow={"steps": [{"write": {"path": "x", "content": "x"}}]})
    task = Task.objects.get(pk=view["id"])
    # Put the task in the starting state directly: this is the fixture, not the code under test.
    Task.objects.filter(pk=task.pk).update(state=state, waiting_for="approval" if state == State.WAITING else "")
    task.refresh_from_db()
    return task


@pytest.mark.parametrize(("old", "new"), MOVES, ids=[f"{o}->{n}" for o, n in MOVES])
def test_each_move_is_allowed_exactly_when_the_table_says(box, old, new):
    task = _task_in(box, old)
    version, seq = task.version, task.event_seq
    if new in ALLOWED[old]:
        services.transition(task, new)
        task.refresh_from_db()
        assert task.state == new
        assert task.version == version + 1
        last = TaskEvent.objects.filter(task=task).order_by("-seq").first()
        assert last.kind == "status" and last.seq == seq + 1 and last.data["to"] == new
    else:
        with pytest.raises(Conflict):
            services.transition(task, new)
        task.refresh_from_db()
        assert task.state == old and task.version == version
        assert task.event_seq == seq


REVIEWS = ["", *Review]
REVIEW_PAIRS = [(old, new) for old in REVIEWS for new in Review if old != new]


@pytest.mark.parametrize(("old", "new"), REVIEW_PAIRS, ids=[f"{o or 'none'}->{n}" for o, n in REVIEW_PAIRS])
def test_each_review_move_is_allowed_exactly_when_its_table_says(box, old, new):
    task = _task_in(box, State.DONE)
    Task.objects.filter(pk=task.pk).update(review=old)
    task.refresh_from_db()
    version = task.version
    if new in REVIEW_MOVES[old]:
        services.bump_version(task, "note", f"review {new}", {}, review=new)
        task.refresh_from_db()
        assert task.review == new and task.version == version + 1
    else:
        with pytest.raises(Conflict):
            services.bump_version(task, "note", f"review {new}", {}, review=new)
        task.refresh_from_db()
        assert task.review == old and task.version == version


def test_a_stale_version_is_a_conflict_not_an_overwrite(box):
    task = _task_in(box, State.RUNNING)
    stale = Task.objects.get(pk=task.pk)
    services.transition(task, State.DONE)
    with pytest.raises(Conflict):
        services.transition(stale, State.FAILED)
    assert Task.objects.get(pk=task.pk).state == State.DONE


def test_an_illegal_move_over_the_api_is_409_conflict(box):
    view = box.create(title="t", flow={"steps": [{"write": {"path": "x", "content": "x"}}]})
    box.wait_state(view["id"], "done")
    response = box.api.post(f"/api/tasks/{view['id']}/cancel")
    assert response.status_code == 409
    assert response.json()["code"] == "CONFLICT"
    assert box.task(view["id"])["state"] == "done"


@pytest.mark.skipif(not settings.DB_IS_POSTGRES, reason="row-level races need PostgreSQL")
@pytest.mark.parametrize("attempt", range(3))
def test_two_concurrent_moves_exactly_one_wins(box, attempt):
    task = _task_in(box, State.RUNNING)
    barrier = threading.Barrier(2)
    results: dict[str, str] = {}

    def move(target: str) -> None:
        close_old_connections()
        mine = Task.objects.get(pk=task.pk)
        barrier.wait()
        try:
            services.transition(mine, target)
            results[target] = "won"
        except Conflict:
            results[target] = "conflict"
        finally:
            connection.close()

    threads = [threading.Thread(target=move, args=(t,)) for t in (State.DONE, State.CANCELLED)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(results.values()) == ["conflict", "won"], results
    final = Task.objects.get(pk=task.pk)
    winner = next(t for t, r in results.items() if r == "won")
    assert final.state == winner
    assert final.version == task.version + 1
    seqs = list(TaskEvent.objects.filter(task=task).values_list("seq", flat=True).order_by("seq"))
    assert seqs == list(range(1, len(seqs) + 1))  # gapless, and the loser left no event
