"""What the running side of a task needs from the app that keeps its approvals, questions and
consequential actions (``approvals``), declared here so that ``tasks`` never imports it.

``approvals`` sits above ``tasks``: it reads tasks, moves them through ``tasks.services`` and
records under a run's lease. The workers, the broker, the tool registry and a task's final move
still have to open a pause's blockers and record an action's receipt; they do it through the two
small interfaces below, which ``approvals`` installs when the apps are ready
(``ApprovalsConfig.ready``). The words both sides use (the kinds and states) live here too, and
``approvals.models`` uses them for its fields.
"""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Protocol

from django.db import models

if TYPE_CHECKING:
    from tasks.models import Run, Task
    from tasks.run.recorder import StepRecorder
    from tasks.workers.base import Paused

RECEIPT_EXCERPT = 300  # characters of a response or result kept in a receipt


class ApprovalKind(models.TextChoices):
    IRREVERSIBLE = "irreversible"
    SPENDING = "spending"
    ACTION = "action"
    PAYMENT = "payment"
    CHECKPOINT = "checkpoint"


class ApprovalState(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    STALE = "stale"
    EXPIRED = "expired"


class QuestionKind(models.TextChoices):
    INPUT = "input"
    HUMAN = "human"
    REPAIR = "repair"
    REPLAN = "replan"
    TEXT = "text"
    ACTION = "action"  # what happened to an action whose outcome is unknown


class QuestionState(models.TextChoices):
    STAGED = "staged"
    OPEN = "open"
    ANSWERED = "answered"
    CANCELLED = "cancelled"


class ActionState(models.TextChoices):
    PROPOSED = "proposed"
    APPROVED = "approved"
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"
    CANCELLED = "cancelled"


class ActionKind(models.TextChoices):
    TOOL = "tool"  # a call of a tool marked irreversible
    HTTP = "http"  # a flow's http step with stop_before


class ActionUnknown(Exception):
    """The action's outcome is unknown: only the owner can say what happened. ``action`` is an
    ``approvals.models.Action``."""

    def __init__(self, action: Any) -> None:
        why = action.error or "the worker stopped between attempting it and recording its receipt"
        super().__init__(f"the outcome of action {action.pk} ({action.tool}) is unknown: {why}")
        self.action = action


class ActionFailedBefore(Exception):
    """An earlier run attempted the action and it failed; it is not attempted again."""

    def __init__(self, action: Any) -> None:
        super().__init__(f"action {action.pk} ({action.tool}) failed before: {action.error or 'failed'}")
        self.action = action


def receipt_digest(value: Any) -> str:
    raw = value if isinstance(value, bytes) else (value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)).encode()
    return "sha256:" + hashlib.sha256(raw).hexdigest()


class Blockers(Protocol):
    """Opening a pause's approvals and questions, and closing them when the task ends
    (``approvals.blockers``). Rows are handed back as the app's own models (``Any`` here)."""

    def request_approval(self, task: Task, kind: ApprovalKind, summary: str, detail: dict[str, Any] | None = None,
                         guard: dict[str, Any] | None = None, amount_cents: int = 0) -> Any: ...

    def open_question(self, task: Task, run: Run | None, kind: QuestionKind, prompt: str,
                      fields: list[dict[str, Any]] | None = None) -> Any: ...

    def open_blockers_for_pause(self, task: Task, run: Run, outcome: Paused) -> None: ...

    def close_for_final_move(self, task: Task) -> None: ...

    def approval_state(self, approval_id: int) -> str | None: ...

    def question_state(self, question_id: int) -> str | None: ...

    def question_outcome(self, question_id: int) -> tuple[str, Any]: ...


class Actions(Protocol):
    """A consequential call's record, written under the run's lease (``approvals.actions``)."""

    def policy_of(self, task: Task, **extra: Any) -> dict[str, Any]: ...

    def propose(self, recorder: StepRecorder, run_id: int, *, kind: ActionKind, target: str, position: str, args: Any,
                policy: dict[str, Any]) -> Any: ...

    def replayed_receipt(self, action: Any) -> dict[str, Any] | None: ...

    def begin(self, recorder: StepRecorder, run_id: int, action: Any) -> None: ...

    def succeed(self, recorder: StepRecorder, action: Any, receipt: dict[str, Any]) -> None: ...

    def fail(self, recorder: StepRecorder, action: Any, receipt: dict[str, Any], error: str) -> None: ...

    def uncertain(self, recorder: StepRecorder, action: Any, error: str) -> None: ...

    def close_in_flight(self, task: Task, why: str, *, run_id: int | None = None) -> int: ...

    def link_question(self, action_id: int, question: Any) -> None: ...

    def reconcile_fields(self) -> list[dict[str, Any]]: ...


class _Installed:
    blockers: Blockers | None = None
    actions: Actions | None = None


NOT_INSTALLED = "no app installed the pause interfaces: is 'approvals' in INSTALLED_APPS?"


def install(*, blockers: Blockers, actions: Actions) -> None:
    """Called once by ``ApprovalsConfig.ready``."""
    _Installed.blockers, _Installed.actions = blockers, actions


def blockers() -> Blockers:
    if _Installed.blockers is None:
        raise RuntimeError(NOT_INSTALLED)
    return _Installed.blockers


def actions() -> Actions:
    if _Installed.actions is None:
        raise RuntimeError(NOT_INSTALLED)
    return _Installed.actions
