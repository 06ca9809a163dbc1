"""Pausing a task while a live process waits on the owner (see docs/internals/decisions.md).

A command worker's process cannot be resumed once it exits, so a pause asked for from inside it
(``box approve``, an irreversible or over-budget tool call, ``box spend`` over budget, ``box
ask``, ``box need-human``) is held: the task moves to ``waiting`` with an approval or an open
question, exactly as for any other pause, while the run keeps its lease and the process blocks
on its broker call. When the owner decides (through the approvals/continue API), the broker
sees it, moves the task back to ``running`` and answers the call. A denial or a cancel ends the
task, which closes the run; the call then fails and the process is stopped.

Time spent held does not count against ``max_elapsed_ms`` (``RunContext.hold``).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from tasks import budget, pauses, services
from tasks.broker.protocol import Denied, TaskEnded
from tasks.models import Task
from tasks.pauses import ApprovalKind, ApprovalState, QuestionKind, QuestionState
from tasks.run.context import RunContext
from tasks.states import FINAL, State, WaitingFor
from tasks.vault.facts import Facts

POLL_SECONDS = 0.1
T = TypeVar("T")


class Holds:
    """The pauses of one run's broker. One at a time: a second waits for the first to settle."""

    def __init__(self, ctx: RunContext, closing: threading.Event) -> None:
        self.ctx = ctx
        self.closing = closing
        self._one_at_a_time = threading.Lock()

    def approval(self, kind: ApprovalKind, summary: str, *, guard: dict[str, Any], detail: dict[str, Any] | None = None,
                 amount_cents: int = 0) -> None:
        """Return once the owner approved; raise ``Denied`` or ``TaskEnded`` otherwise."""

        with self._one_at_a_time:
            def pause(task: Task) -> tuple[int, int]:
                self._move(task, State.WAITING, f"waiting for approval: {summary}", waiting_for=WaitingFor.APPROVAL,
                           pause={"message": summary, "held": True, "amount_cents": amount_cents})
                # budget_cents: the budget when asked, so approving raises it exactly once by the amount.
                held = {**guard, "held_run": self.ctx.run.pk, "budget_cents": task.budget_cents}
                approval = pauses.blockers().request_approval(task, kind, summary, detail, held, amount_cents)
                return approval.pk, task.budget_cents

            approval_id, budget_before = self._write(pause)
            decided = self._wait(lambda: pauses.blockers().approval_state(approval_id) != ApprovalState.PENDING)
            state = pauses.blockers().approval_state(approval_id)
            if not decided or state != ApprovalState.APPROVED:
                raise Denied(f"the owner did not approve: {summary}" if state == ApprovalState.DENIED
                             else "the task ended while waiting for approval")

            def resume(task: Task) -> None:
                if kind == ApprovalKind.SPENDING:
                    budget.raise_budget(task.pk, budget_before, amount_cents)
                self._move(task, State.RUNNING, f"approved: {summary}", data={"approval": approval_id})

            self._write(resume)

    def question(self, waiting_for: WaitingFor, question_kind: QuestionKind, prompt: str, fields: list[dict[str, Any]],
                 *, name: str | None = None, opened: Callable[[Any], None] | None = None) -> dict[str, Any]:
        """Open a question and wait for its answer; ``name``: the fact whose value to return;
        ``opened`` is called with the question in the transaction that opens it."""

        with self._one_at_a_time:
            def pause(task: Task) -> int:
                self._move(task, State.WAITING, f"waiting for {waiting_for}: {prompt}", waiting_for=waiting_for,
                           pause={"message": prompt, "fields": fields, "held": True})
                question = pauses.blockers().open_question(task, self.ctx.run, question_kind, prompt, fields)
                if opened is not None:
                    opened(question)
                return question.pk

            question_id = self._write(pause)

            def answered() -> bool:
                # The answering side merges values into the task's facts and marks the question.
                return pauses.blockers().question_state(question_id) != QuestionState.OPEN

            if not self._wait(answered):
                raise TaskEnded("the task ended while waiting for an answer")

            def resume(task: Task) -> dict[str, Any]:
                state, answer = pauses.blockers().question_outcome(question_id)
                if state == QuestionState.CANCELLED:
                    raise TaskEnded("the question was withdrawn")
                self._move(task, State.RUNNING, f"answered: {prompt}", data={"question": question_id})
                # A new value may be secret: from now on the log must mask it too.
                self.ctx.facts = Facts.of(task).with_vault(task.vault_secrets or [])
                self.ctx.refresh_redactor()
                if name is not None:
                    return {"value": self.ctx.facts.values.get(name, "")}
                return {"answer": answer}

            return self._write(resume)

    # --- helpers ---------------------------------------------------------------------------

    def _write(self, change: Callable[[Task], T]) -> T:
        """Run ``change`` on the freshly locked task, in a transaction bound to the run's lease."""

        def write() -> T:
            task = Task.objects.select_for_update().get(pk=self.ctx.task.pk)  # the move reads state+version
            if task.is_final():
                raise TaskEnded(f"the task is {task.state}")
            return change(task)

        return self.ctx.recorder.guarded(write)

    def _move(self, task: Task, new_state: str, summary: str, **fields: Any) -> None:
        if task.state == new_state:
            return  # the deciding side already moved it
        data = fields.pop("data", None)
        services.transition(task, new_state, summary=summary, data=data, **fields)

    def _wait(self, decided: Callable[[], bool]) -> bool:
        """Poll until ``decided``; False when the run ends first (cancel, deny, lease lost)."""
        self.ctx.hold()
        try:
            while not (self.closing.is_set() or self.ctx.stop.is_set()):
                if decided():
                    return True
                if Task.objects.filter(pk=self.ctx.task.pk, state__in=FINAL).exists():
                    return False
                self.closing.wait(POLL_SECONDS)
            return False
        finally:
            self.ctx.unhold()
