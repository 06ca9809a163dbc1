"""Cost and budget (docs/internals/approvals.md#facts-secrets-and-budgets): every paid call is admitted against ``budgetCents`` first.

Admission is one transaction on the task's row: check the budget, count the call against its
limit, and record the ``cost`` event (which adds to ``cost_cents``). A call that would cross the
budget raises ``OverBudget`` before anything is written, so the caller can pause for the
owner's OK and the paid call is never made unapproved.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from django.db.models import F, Value
from django.db.models.functions import Greatest

from tasks.models import EventKind, Task
from tasks.run.recorder import Counts, StepRecorder


class OverBudget(Exception):
    """The call would cross the task's budget; ``needed_cents`` is how much more it asks for."""

    def __init__(self, cents: int, spent_cents: int, budget_cents: int) -> None:
        self.cents = cents
        self.spent_cents = spent_cents
        self.budget_cents = budget_cents
        self.needed_cents = spent_cents + cents - budget_cents
        super().__init__(
            f"this call costs {cents}¢; the task has spent {spent_cents}¢ of its {budget_cents}¢ budget, "
            f"so it needs {self.needed_cents}¢ more"
        )


def admit(
    recorder: StepRecorder,
    cents: int,
    summary: str,
    data: dict[str, Any] | None = None,
    *,
    counter: tuple[str, str] | None = None,
    before_cost: Callable[[], None] | None = None,
) -> None:
    """Admit one call costing ``cents``: budget check, limit count, ``cost`` event, atomically.

    ``counter`` is ``(spent key, limit name)``, e.g. ``("actions", "max_actions")``.
    ``before_cost`` writes what should precede the cost line in the log (the ``tool_call``).
    Raises ``OverBudget`` (nothing written) or ``LimitReached``; both leave the log unchanged.
    """

    def write() -> None:
        # Lock the row: two calls at once must not both squeeze under the same budget.
        task = Task.objects.select_for_update().only("cost_cents", "budget_cents").get(pk=recorder.task.pk)
        if cents > 0 and task.cost_cents + cents > task.budget_cents:
            raise OverBudget(cents, task.cost_cents, task.budget_cents)
        if counter is not None:
            recorder.count(*counter)
        if before_cost is not None:
            before_cost()
        if cents > 0:
            recorder.event(EventKind.COST, summary, {**(data or {}), "cents": cents}, cost_cents=cents)

    recorder.guarded(write)


def raise_budget(task_id: str, base_cents: int, amount_cents: int) -> None:
    """Approving a spending request raises the budget to ``base + amount`` (never lowers it).

    Idempotent: whoever applies the approval first wins and a second application is a no-op.
    Call inside the transaction that records the decision.
    """
    Task.objects.filter(pk=task_id).update(budget_cents=Greatest(F("budget_cents"), Value(base_cents + amount_cents)))


MODEL_CALLS = Counts("model_calls", "max_model_calls")  # a model call, within ``max_model_calls``


def check_model_call(recorder: StepRecorder, estimate_cents: int) -> None:
    """Before a model call that its own step's write counts (``MODEL_CALLS``, one statement on
    PostgreSQL): ``OverBudget`` when its estimated cost would cross the budget. A plain read, no
    lock: only the task's run adds to its cost, and a budget raised meanwhile (an approval) only
    makes the check err on the careful side."""
    if estimate_cents <= 0:
        return
    cost, budget = Task.objects.filter(pk=recorder.task.pk).values_list("cost_cents", "budget_cents").get()
    if cost + estimate_cents > budget:
        raise OverBudget(estimate_cents, cost, budget)


def admit_model_call(recorder: StepRecorder, estimate_cents: int) -> None:
    """Before a model call: ``OverBudget`` when its estimated cost would cross the budget
    (nothing written), else count it against ``max_model_calls`` (``LimitReached`` past it)."""

    def write() -> None:
        # One locked read for both checks, counted in this transaction (``StepRecorder.count``
        # would open a second, nested one that locks the row and proves the lease again).
        task = Task.objects.select_for_update().only("cost_cents", "budget_cents", "spent", "limits").get(pk=recorder.task.pk)
        if estimate_cents > 0 and task.cost_cents + estimate_cents > task.budget_cents:
            raise OverBudget(estimate_cents, task.cost_cents, task.budget_cents)
        recorder.task.limits = task.limits  # as the row is now: the next step's write is checked against it
        spent = recorder._counted_from(task, "model_calls", "max_model_calls")
        assert spent is not None
        Task.objects.filter(pk=task.pk).update(spent=spent)
        recorder.task.spent = spent

    recorder.guarded(write)


def charge_model(recorder: StepRecorder, cents: float, summary: str, data: Mapping[str, object] | None = None) -> int:
    """After a model call: add what it cost. Fractions of a cent are carried in
    ``spent.model_millicents`` and charged whole as they add up; returns the cents charged now."""
    millicents = max(0, round(cents * 1000))

    def write() -> int:
        task = Task.objects.select_for_update().only("spent").get(pk=recorder.task.pk)
        spent = dict(task.spent)
        before = int(spent.get("model_millicents", 0))
        after = before + millicents
        whole = math.ceil(after / 1000) - math.ceil(before / 1000)
        spent["model_millicents"] = after
        Task.objects.filter(pk=task.pk).update(spent=spent)
        recorder.task.spent = spent
        if whole > 0:
            recorder.event(EventKind.COST, summary, {**(data or {}), "cents": whole}, cost_cents=whole)
        return whole

    return recorder.guarded(write)
