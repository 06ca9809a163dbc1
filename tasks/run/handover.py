"""What a finish keeps for the worker that goes on after it (``finish.finish_run``'s ``hand_over``).

A ``Handover`` is passed, as an argument, down every call of the finish that makes a run due now
(``leases.create_run``, ``services``' wake-ups of dependents) or asks for a task's release
(``lifecycle.release_soon``). A call given none sends its runs after commit and hands its
releases to the janitor, as every caller outside a finish wants; so does a task the finish
creates (a recovery review, ``services.open_recovery_review``): its first run is sent as any new
task's.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

from django.db import transaction

from tasks.run import leases

if TYPE_CHECKING:
    from tasks.run.lifecycle import Held, Then


@dataclasses.dataclass
class Handover:
    """The runs made due now through it (``noted``, in order: a run made in a savepoint that was
    rolled back is noted too, and its claim finds nothing); with ``keep``, the first of them to
    commit, held back from the queue for the worker (``held``): no second delivery to another
    worker, which would only find the run taken. It was written as sent, so if the process dies
    holding it, the scheduler sends it again after ``BOX_RESEND_S`` (``leases.stranded_runs``).

    With ``keep``, the releases asked for through it wait in ``releases`` for the worker
    to hand to the janitor (``lifecycle.submit_held``) once it opened the next run's view: that
    opening seals the ended task's layer itself (the only part of its release the next run
    needs), and a janitor releasing beside it would only take turns with it at the interpreter
    and wait for the same layer's lock. Nothing waits on a kept release for correctness; one a
    process dies holding is finished by start-up reconcile, as any release is."""

    keep: bool
    noted: list[int] = dataclasses.field(default_factory=list)
    held: int | None = None
    releases: Held = dataclasses.field(default_factory=list)

    def send_after_commit(self, run_id: int) -> None:
        """Run ``run_id`` was made due now in this transaction: note it, and once it commits,
        hold it or send it (``committed``)."""
        self.noted.append(run_id)
        transaction.on_commit(functools.partial(self.committed, run_id))

    def committed(self, run_id: int) -> None:
        """The transaction that made run ``run_id`` committed: hold it, or send it."""
        if self.keep and self.held is None:
            self.held = run_id
            return
        leases.send(run_id)

    def keeps(self, task_id: str, then: Then) -> bool:
        """Keep the release of ``task_id`` (then ``then``) for the worker; False when releases
        are not kept (the caller hands it to the janitor)."""
        if not self.keep:
            return False
        self.releases.append((task_id, then))
        return True
