"""django-q2 entry points. Thin and idempotent; they take ids."""
from __future__ import annotations

import logging
import threading
import time
import traceback

from django.conf import settings
from django.db import close_old_connections, connection

from tasks import runs
from tasks.context import RunContext
from tasks.facts import Facts
from tasks.recorder import LeaseLost, LimitReached, StepRecorder
from tasks.workers.base import Failed, Outcome

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Extends the run's lease while the worker works; sets ``stop`` once the lease is gone."""

    def __init__(self, run_id: int, token: str, stop: threading.Event) -> None:
        super().__init__(name=f"heartbeat-run-{run_id}", daemon=True)
        self.run_id, self.token, self.stop_event = run_id, token, stop
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            while not self.finished.wait(settings.BOX_HEARTBEAT_SECONDS):
                try:
                    alive = runs.heartbeat(self.run_id, self.token)
                except Exception:  # noqa: BLE001 - a busy database is retried next beat
                    log.warning("heartbeat for run %s failed; retrying", self.run_id, exc_info=True)
                    continue
                if not alive:
                    self.stop_event.set()
                    return
        finally:
            connection.close()


def execute_run(run_id: int) -> None:
    """Claim run ``run_id`` and execute it. A second delivery finds it claimed and returns."""
    from tasks import lifecycle
    from tasks.broker.server import serving as broker_serving
    from tasks.finalize import begin_run, finish_run
    from tasks.workers import worker_for

    close_old_connections()
    claimed = runs.claim(run_id)
    if claimed is None:
        log.info("run %s is already taken or closed; nothing to do", run_id)
        return
    run, token = claimed
    task = run.task
    facts = Facts.of(task)
    recorder = StepRecorder(task, run.pk, token, facts.redactor())
    stop = threading.Event()
    heartbeat = Heartbeat(run.pk, token, stop)
    heartbeat.start()
    started = time.monotonic()
    outcome: Outcome
    ctx: RunContext | None = None
    try:
        if not begin_run(task, run, token, recorder):
            return
        remaining = task.limit("max_elapsed_ms")
        deadline = None if remaining is None else started + max(0, remaining - task.spent.get("elapsed_ms", 0)) / 1000
        workdir = lifecycle.prepare(task)
        ctx = RunContext(task=task, run=run, workdir=workdir, facts=facts, recorder=recorder, deadline=deadline, stop=stop)
        # The task's processes reach the box through this run's broker, open while the worker works.
        with broker_serving(ctx) as broker:
            outcome = worker_for(task.worker).run(ctx)
        if broker.limit_reached is not None:  # a broker call ran out of a limit: that ends the task
            outcome = Failed(broker.limit_reached.message, recoverable=True, hint=broker.limit_reached.hint)
    except LeaseLost:
        log.info("run %s lost its lease; its late writes were refused", run_id)
        return
    except LimitReached as exc:
        outcome = Failed(exc.message, recoverable=True, hint=exc.hint)
    except Exception as exc:  # noqa: BLE001 - any crash of a worker fails its task, with the reason
        # The traceback may quote a secret (an argument, a command line): log it redacted.
        log.error("run %s crashed:\n%s", run_id, recorder.redactor.text(traceback.format_exc()))
        outcome = Failed(f"the worker crashed: {type(exc).__name__}: {exc}", recoverable=True, hint="see the box's log")
    finally:
        heartbeat.finished.set()
    held_s = ctx.held_s if ctx is not None else 0.0  # waiting for the owner is not running time
    elapsed_ms = int((time.monotonic() - started - held_s) * 1000)
    try:
        finish_run(task, run, token, recorder, outcome, elapsed_ms)
    except LeaseLost:
        log.info("run %s lost its lease before finishing; its outcome was dropped", run_id)
