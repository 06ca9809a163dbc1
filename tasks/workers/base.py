"""The worker interface and the outcomes a run can end with.

A pause is an outcome that carries a resume point, so a waiting task holds no worker process.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tasks.pauses import ApprovalKind
from tasks.run.recorder import LimitReached
from tasks.states import WaitingFor
from tasks.vault.store import VAULT_FIELD

if TYPE_CHECKING:
    from tasks.run.context import RunContext


@dataclass
class Done:
    summary: str = "finished"


@dataclass
class Failed:
    error: str
    recoverable: bool | None = None
    hint: str = ""


@dataclass(frozen=True)
class ApprovalRequest:
    """The approval a pause asks for. ``guard`` names exactly what the OK allows;
    ``amount_cents``: for spending, how much more budget it asks for."""

    kind: ApprovalKind
    summary: str
    detail: dict[str, Any] = field(default_factory=dict)
    guard: dict[str, Any] = field(default_factory=dict)
    amount_cents: int = 0


@dataclass
class Paused:
    """Stop the run and wait. ``resume`` says where the next run picks up."""

    waiting_for: WaitingFor
    message: str
    resume: dict[str, Any] = field(default_factory=dict)
    fields: list[dict[str, Any]] = field(default_factory=list)  # for input pauses
    approval: ApprovalRequest | None = None
    continuable: bool = True
    reconcile: int | None = None  # the action whose unknown outcome the owner is asked about




def needs_key(name: str, who: str, resume: dict[str, Any] | None = None) -> Paused:
    """A pause asking the owner for the vault key ``name`` that ``who`` needs: one inbox question
    whose answer goes straight into the vault; the task goes on once it is answered. Nothing is
    run and nothing is spent while it waits."""
    why = f"the vault has no {name}, which {who} needs; the answer is kept in the vault, never in the log"
    return Paused(WaitingFor.INPUT, f"the task needs the key {name}", resume=resume or {},
                  fields=[{"name": name, "why": why, "kind": VAULT_FIELD, "options": []}])


class Worker(Protocol):
    def run(self, ctx: RunContext) -> Outcome: ...


@dataclass
class Continue:
    """End this run and go on in a new one from ``resume`` (e.g. after an approved step ran)."""

    resume: dict[str, Any] = field(default_factory=dict)


Outcome = Done | Failed | Paused | Continue


def check_time(ctx: RunContext) -> None:
    """``LimitReached`` once the task has used its running time (all runs together)."""
    left = ctx.time_left()
    if left is not None and left <= 0:
        limit = ctx.task.limit("max_elapsed_ms")
        raise LimitReached("max_elapsed_ms", f"the task used all of its running time (limits.max_elapsed_ms = {limit})",
                           f"raise limits.max_elapsed_ms above {limit} and retry the task")
