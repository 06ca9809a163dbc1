"""The owner's side of a pause: the inbox, deciding approvals, answering questions, continue.

Each answer removes exactly one blocker (or, for ``continue``, the blockers of the pause's kind),
bumps the task's version with a conditional update, and lets ``approvals.blockers`` queue a
fresh run only when no blocker remains and no run of the task is still alive (a live process
may hold the pause; see ``approvals.blockers.request_approval``). Every write of an approval or
question row is ``approvals.blockers``'s.

The task's ``state`` is still written only by ``tasks.services.transition``: a decision that ends
the task (deny) goes through it; the others only bump ``version`` (``tasks.services.bump_version``)
and leave the move back to running to ``tasks.run.finish.begin_run`` when the new run starts.
"""
from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals import actions, blockers, links
from approvals.models import (
    Approval,
    ApprovalKind,
    ApprovalState,
    Question,
    QuestionKind,
    QuestionState,
    Reconciliation,
    SpentLink,
)
from boxsite.core.errors import Conflict, InvalidRequest, NotFound, StaleApproval
from boxsite.core.principal import Principal, Via
from boxsite.core.validation import AnyText, Body, Flag, Names, Obj, Whole
from boxsite.models import Device
from tasks.budget import raise_budget
from tasks.events import record_event
from tasks.models import EventKind, Task
from tasks.services import bump_version, get_task_for, transition
from tasks.spec.flows import missing_names
from tasks.states import ACTIVE, State, WaitingFor
from tasks.vault.facts import Facts, Redactor, guess_kind
from tasks.vault.store import VAULT_FIELD, read_secret, set_secret

# How a decision arrived, by who asked: the portal (a browser session), the phone, or a program.
VIA = {Via.SESSION: "portal", Via.DEVICE: "phone", Via.TOKEN: "api"}
MAX_INPUTS = 100
VERSION_SAW = "'version' is the task version you saw (a whole number)"


class DecideBody(Body):
    """``POST /api/approvals/<id>/approve`` and ``/deny``."""

    version = Whole(required=False, invalid=VERSION_SAW, help_text="the task version you saw; another is STALE_APPROVAL")


class AnswerBody(Body):
    """``POST /api/questions/<id>/answer``. ``inputs`` and ``secretFacts`` are checked against
    the question when it is answered (``_answer``)."""

    inputs = Obj(required=False, help_text="name: value, for a question that asks for values")
    answer = AnyText(required=False, help_text="text, for a question a person answers")
    secretFacts = Names(required=False, allow_null=True, invalid="'secretFacts' is a list of fact names",
                        help_text="names among the inputs whose values are secret")
    version = Whole(required=False, invalid=VERSION_SAW, help_text="the task version you saw")


class ContinueBody(AnswerBody):
    """``POST /api/tasks/<id>/continue``: what the waiting task asked for."""

    approve = Flag(required=False, help_text="for a task waiting for approval")


def decided_via(principal: Principal) -> str:
    return VIA.get(principal.via, principal.via)


# --- who may see which blockers ---------------------------------------------------------------

def get_approval_for(principal: Principal, approval_id: int | str) -> Approval:
    approval = Approval.objects.filter(pk=_int_id(approval_id), task__in=Task.objects.inbox_of(principal)).select_related("task").first()
    if approval is None:
        raise NotFound(f"no approval '{approval_id}'")
    return approval


def get_question_for(principal: Principal, question_id: int | str) -> Question:
    question = Question.objects.filter(pk=_int_id(question_id), task__in=Task.objects.inbox_of(principal)).exclude(
        state=QuestionState.STAGED).select_related("task").first()
    if question is None:
        raise NotFound(f"no question '{question_id}'")
    return question


def inbox_for(principal: Principal) -> tuple[list[Approval], list[Question]]:
    """Every pending approval and open question across the tasks ``principal`` may see."""
    tasks = Task.objects.inbox_of(principal)
    approvals = Approval.objects.filter(task__in=tasks, state=ApprovalState.PENDING).select_related("task", "decided_by")
    questions = Question.objects.filter(task__in=tasks, state=QuestionState.OPEN).select_related("task")
    return list(approvals.order_by("created_at", "pk")[:500]), list(questions.order_by("created_at", "pk")[:500])


def _int_id(raw: int | str) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise NotFound(f"no such item '{raw}'") from None


# --- deciding and answering -------------------------------------------------------------------

class _MarkStale(Exception):
    """Raised inside the decision's transaction; the approval is marked stale after rollback."""

    def __init__(self, approval_id: int, message: str) -> None:
        super().__init__(message)
        self.approval_id = approval_id
        self.message = message


def decide_approval(principal: Principal, approval_id: int | str, *, approve: bool, expected_version: int | None = None) -> Approval:
    """Approve or deny one approval. Approving twice decides once and resumes once.

    Deciding an approval whose task has moved on since it was asked is ``STALE_APPROVAL``;
    so is a decision that names a task ``version`` other than the current one.
    """
    approval = get_approval_for(principal, approval_id)
    try:
        with transaction.atomic():
            task = _lock(approval.task_id)
            approval.refresh_from_db()
            _decide_locked(principal, task, approval, approve, expected_version)
    except _MarkStale as stale:
        blockers.mark_stale(stale.approval_id)
        raise StaleApproval(stale.message, field="approval") from None
    approval.refresh_from_db()
    return approval


def decide_by_link(token: str) -> Approval:
    """Decide the one approval a signed link names (``approvals.links``), as the phone it was
    sent to: no session, the signature is the credential, and the phone's limits apply. A link
    works once, only while its phone is paired and its approval pending."""
    link = links.read(token)
    device = Device.objects.filter(pk=link.device, revoked_at__isnull=True).select_related("user").first()
    if device is None or not device.user.is_active:
        raise NotFound("the phone this link was sent to is no longer paired with the box", field="token")
    if SpentLink.objects.filter(nonce=link.nonce).exists():
        raise Conflict("this link was used already: it works once; open the box to see the task", field="token",
                       code="LINK_USED")
    principal = Principal.phone(device)
    approval = get_approval_for(principal, link.approval)
    if approval.state != ApprovalState.PENDING:
        raise Conflict(f"this approval is no longer pending (it is {approval.state}); nothing was decided",
                       field="approval", state=approval.state)
    decided = decide_approval(principal, approval.pk, approve=link.approve)
    try:
        with transaction.atomic():
            SpentLink.objects.create(nonce=link.nonce, approval=decided)
    except IntegrityError:
        # The same link raced itself: the other use decided (deciding twice decides once).
        raise Conflict("this link was used already: it works once", field="token", code="LINK_USED") from None
    return decided


def answer_question(principal: Principal, question_id: int | str, body: Any) -> Question:
    """Answer one open question: ``{"inputs": {...}}`` for input fields, ``{"answer": "..."}``
    otherwise. Removes exactly that blocker; the task goes on only when none remains."""
    fields = AnswerBody.parse({} if body is None else body)
    question = get_question_for(principal, question_id)
    with transaction.atomic():
        task = _lock(question.task_id)
        question.refresh_from_db()
        if question.state != QuestionState.OPEN:
            raise Conflict(f"this question is already {question.state}", field="question", state=question.state)
        _check_version(task, fields.get("version"))
        if question.kind == QuestionKind.INPUT and "inputs" not in fields:
            raise InvalidRequest("this question asks for values: send {\"inputs\": {name: value}}", field="inputs")
        _answer(principal, task, [question], fields.get("inputs"), fields.get("answer"), fields.get("secretFacts", []))
    question.refresh_from_db()
    return question


def continue_task(principal: Principal, task_id: str, body: Any) -> Task:
    """Answer what a waiting task asked for (docs/internals/approvals.md#a-pauses-life).

    ``input``: ``{"inputs": {...}}`` merges the values, checks everything again (a value may make
    a name secret) and asks again for what is still missing, or goes on. ``approval`` and a
    continuable ``checkpoint``: ``{"approve": true|false}`` decides the pending approval.
    ``human``: any continue re-runs from the step that hit the wall (``answer`` is kept for the
    person's own notes). A non-continuable checkpoint is final-like: only cancel releases it.
    """

    fields = ContinueBody.parse({} if body is None else body)
    try:
        with transaction.atomic():
            task = get_task_for(principal, task_id, for_update=True)  # locked: blockers are read, then changed
            _continue_locked(principal, task, fields)
    except _MarkStale as stale:
        blockers.mark_stale(stale.approval_id)
        raise StaleApproval(stale.message, field="approve") from None
    return Task.objects.select_related("workspace").get(pk=task_id)


def _continue_locked(principal: Principal, task: Task, fields: dict[str, Any]) -> None:
    if task.state != State.WAITING:
        raise Conflict(f"a {task.state} task is not waiting for anything", field="state", state=task.state)
    waiting_for = task.waiting_for
    if waiting_for == WaitingFor.CHECKPOINT and not task.continuable:
        raise Conflict("this checkpoint cannot be continued: a person finishes it (for example the payment) "
                       "outside the box; cancel the task to release what it holds", field="state", state=task.state)
    if waiting_for == WaitingFor.PLAN:
        raise Conflict("this task waits for a plan: start a new task with a 'flow'", field="state", state=task.state)
    if waiting_for in (WaitingFor.APPROVAL, WaitingFor.CHECKPOINT):
        if not isinstance(fields.get("approve"), bool):
            raise InvalidRequest("this task waits for approval: send {\"approve\": true} or {\"approve\": false}", field="approve")
        pending = list(blockers.pending_approvals(task))
        if not pending:
            raise Conflict("this task has no pending approval", field="approve")
        if len(pending) > 1:
            raise InvalidRequest(f"this task has {len(pending)} pending approvals; decide each at /api/approvals/<id>", field="approve")
        _decide_locked(principal, task, pending[0], fields["approve"], fields.get("version"))
        return
    _check_version(task, fields.get("version"))
    if waiting_for == WaitingFor.INPUT:
        if "inputs" not in fields:
            raise InvalidRequest("this task waits for values: send {\"inputs\": {name: value}}", field="inputs")
        questions = [q for q in blockers.open_questions(task) if q.kind == QuestionKind.INPUT]
    else:
        questions = [q for q in blockers.open_questions(task) if q.kind in (QuestionKind.HUMAN, QuestionKind.ACTION)]
    _answer(principal, task, questions, fields.get("inputs"), fields.get("answer"), fields.get("secretFacts", []))


def _decide_locked(principal: Principal, task: Task, approval: Approval, approve: bool, expected_version: int | None) -> None:
    wanted = ApprovalState.APPROVED if approve else ApprovalState.DENIED
    if approval.state != ApprovalState.PENDING:
        if approval.state == wanted:
            return  # deciding twice decides once: no second resume
        if approval.state == ApprovalState.STALE or approval.decided_via == blockers.ENDED_WITH_TASK:
            raise StaleApproval(f"the task moved on since this approval was asked (it is {task.state} now); "
                                "nothing was decided", field="approval")
        raise Conflict(f"this approval was already {approval.state}", field="approval", state=approval.state)
    if expected_version is not None and expected_version != task.version:
        raise StaleApproval(f"the task is at version {task.version}, not {expected_version}; reload it and decide again",
                            field="version")
    if task.version != approval.task_version or task.state not in ACTIVE:
        raise _MarkStale(approval.pk, f"the task moved on since this approval was asked (version {approval.task_version}, "
                                      f"now {task.version}); nothing was decided")
    via = decided_via(principal)
    blockers.record_decision(approval, wanted, principal.user, via)
    data = {"approval": approval.pk, "decision": wanted, "via": via, "kind": approval.kind}
    if not approve:
        record_event(task, EventKind.APPROVAL, f"denied ({via}): {approval.summary}", data)
        transition(task, State.CANCELLED, summary=f"cancelled: the owner denied '{approval.summary}'", data={"by": via})
        return
    if approval.kind == ApprovalKind.SPENDING and approval.amount_cents:
        raise_budget(task.pk, int(approval.guard.get("budget_cents", task.budget_cents)), approval.amount_cents)
    actions.mark_approved(approval)
    _bump(task, EventKind.APPROVAL, f"approved ({via}): {approval.summary}", data)
    blockers.resume_if_clear(task)


def _answer(principal: Principal, task: Task, questions: list[Question], inputs: Any, answer: Any,
            secret_additions: Any) -> None:
    """Answer ``questions`` of a locked, waiting task; merge inputs; ask again or go on."""
    if task.state != State.WAITING:
        raise Conflict(f"a {task.state} task is not waiting for an answer", field="state", state=task.state)
    declared = _secret_names(secret_additions)
    facts = Facts.of(task)
    asked = [f for q in questions if q.kind != QuestionKind.ACTION for f in q.fields]  # values, not a choice
    if inputs is not None:
        inputs = _parse_inputs(inputs)
        # A missing vault key the task asked for goes straight into the vault: never a fact, never the log.
        keys = {f["name"] for f in asked if f.get("kind") == VAULT_FIELD} & set(inputs)
        for name in sorted(keys):
            if not inputs[name]:
                raise InvalidRequest(f"'{name}' is a key for the vault and cannot be empty", field=f"inputs.{name}")
            set_secret(name, inputs[name])
        inputs = {k: ("${" + k + "}" if k in keys else v) for k, v in inputs.items()}
        facts = facts.merged({k: v for k, v in inputs.items() if k not in keys}, declared)
    elif declared:
        facts = facts.merged({}, declared)
    if answer is not None and not isinstance(answer, str):
        raise InvalidRequest("'answer' is text", field="answer")
    reconciling = [(q, actions.action_for_question(q)) for q in questions if q.kind == QuestionKind.ACTION]
    if reconciling and answer not in actions.RECONCILE_OPTIONS:
        raise InvalidRequest("this question asks what happened to an action: answer one of "
                             + ", ".join(actions.RECONCILE_OPTIONS), field="answer")
    redact = facts.redactor()
    via = decided_via(principal)
    now = timezone.now()
    for question in questions:
        stored: dict[str, Any] = {"inputs": {k: v for k, v in (inputs or {}).items() if k in {f["name"] for f in question.fields}}}
        if answer is not None:
            stored["answer"] = answer[:2000]
        blockers.record_answer(question, redact.redact(stored), principal.user, via, now)
    missing = still_missing(task, facts, asked) if task.waiting_for == WaitingFor.INPUT or asked else []
    updates: dict[str, Any] = {}
    if inputs is not None or declared:
        updates["facts"] = facts.sealed()
        updates["secret_facts"] = sorted(set(task.secret_facts or []) | set(declared))
    if missing:
        updates["pause"] = {**(task.pause or {}), "message": "the task still needs values", "fields": missing}
    names = sorted((inputs or {}).keys())
    summary = f"answered ({via})" + (f": {', '.join(names)}" if names else "")
    _bump(task, EventKind.QUESTION, summary, {"questions": [q.pk for q in questions], "names": names, "via": via},
          redactor=redact, **updates)
    if missing:
        blockers.open_question(task, None, QuestionKind.INPUT, "the task still needs values", missing)
        return
    for _question, action in reconciling:
        if action is not None:
            actions.reconcile(task, action, Reconciliation(str(answer)), principal.user, via)
    if answer == Reconciliation.FAIL and reconciling:
        transition(task, State.FAILED, summary="failed: the owner said to fail the task after an action's unknown outcome",
                   data={"by": via}, error="the owner failed the task: an action's outcome was unknown")
        return
    blockers.resume_if_clear(task)


def still_missing(task: Task, facts: Facts, asked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input fields nothing supplies yet: what was asked and is still empty, then every
    ``${name}`` of the flow that no fact, var or earlier step supplies."""

    values = {**(task.records or {}), **facts.values}
    have = {name for name, value in values.items() if value not in ("", None)}
    have |= {f["name"] for f in asked if f.get("kind") == VAULT_FIELD and read_secret(f["name"]) is not None}
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for field in asked:
        if field["name"] not in have and field["name"] not in seen and not field.get("optional"):
            seen.add(field["name"])
            out.append(field)
    if task.flow:
        for name in missing_names(task.flow, {k: v for k, v in values.items() if k in have}):
            if name not in seen:
                seen.add(name)
                out.append({"name": name, "why": f"the flow uses ${{{name}}} and no fact supplies it",
                            "kind": guess_kind(name), "options": []})
    return out


# --- the pieces ------------------------------------------------------------------------------

def _lock(task_id: str) -> Task:
    # select_for_update: a decision reads the task's blockers and then changes them; two
    # deciders must take turns (SQLite serialises whole transactions anyway).
    return Task.objects.select_for_update().select_related("workspace").get(pk=task_id)


def _bump(task: Task, kind: str, summary: str, data: dict[str, Any], *, redactor: Redactor | None = None, **fields: Any) -> None:
    """Bump ``task.version`` (and write ``fields``): ``tasks.services.bump_version``. Blockers
    still open belong to the same pause, so they are bound to the new version with it."""
    old = task.version
    bump_version(task, kind, summary, data, redactor=redactor, **fields)
    blockers.bind_to_version(task, old)


def _check_version(task: Task, expected: Any) -> None:
    if expected is not None and expected != task.version:
        raise Conflict(f"the task is at version {task.version}, not {expected}; reload it and try again", field="version")


def _parse_inputs(inputs: Any) -> dict[str, str]:
    if not isinstance(inputs, dict) or not inputs:
        raise InvalidRequest("'inputs' is an object of name: value", field="inputs")
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequest(f"at most {MAX_INPUTS} inputs at once", field="inputs")
    out: dict[str, str] = {}
    for name, value in inputs.items():
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise InvalidRequest("an input name is a non-empty string", field="inputs")
        if not (isinstance(value, (str, int, float, bool)) or value is None):
            # Never echo the value: it may be a secret.
            raise InvalidRequest(f"input '{name}' must be a plain value (text, number or true/false)", field=f"inputs.{name}")
        out[name] = "" if value is None else value if isinstance(value, str) else str(value)
    return out


def _secret_names(raw: Any) -> list[str]:
    if raw in (None, []):
        return []
    if not isinstance(raw, list) or not all(isinstance(n, str) and n for n in raw):
        raise InvalidRequest("'secretFacts' is a list of fact names", field="secretFacts")
    return list(dict.fromkeys(raw))
