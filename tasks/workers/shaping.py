"""Output shaping: when a task with ``output`` finishes, the model turns what it saved into the
answer the caller asked for (``output.instructions``), checked against ``output.schema``.

The result is kept in ``records["result"]`` (shown as the view's ``result``, beside the raw
records, which stay as they were). It runs in the finishing run, after the worker: a budget
pause resumes straight into shaping (``resume["shape"]``), never into the work again. A model
that fails or answers outside the schema leaves the task done with its records, and says why in
``records["resultError"]`` and the log.
"""
from __future__ import annotations

import json
from typing import Any

from tasks.llm.client import KeyMissing, ModelError, NoModel
from tasks.models import EventKind
from tasks.run.context import RunContext
from tasks.run.evidence import bounded
from tasks.states import WaitingFor
from tasks.tools.registry import NeedsApproval
from tasks.vault.facts import open_records
from tasks.workers.asking import ask_model
from tasks.workers.base import ApprovalRequest, Done, Outcome, Paused, needs_key

SHAPE_RESUME = "shape"


def shape_output(ctx: RunContext, done: Done) -> Outcome:
    """``done`` once the result is shaped (or could not be); a pause when the call needs an OK."""
    output: dict[str, Any] = ctx.task.output or {}
    stored = {k: v for k, v in (ctx.task.records or {}).items() if k not in ("result", "resultError")}
    records = ctx.recorder.redactor.redact(open_records(stored))  # the model sees secrets only as ${name}
    messages = [
        {"role": "system", "content": "You turn what a finished task saved into the answer its owner asked for. "
                                      "Use only the records given; do not invent values."},
        {"role": "user", "content": f"Instructions: {output.get('instructions', '')}\n\nThe task: {ctx.task.title}\n"
                                    f"It finished with: {done.summary}\n\nWhat it saved (JSON):\n"
                                    + json.dumps(records, default=str)[:60_000]},
    ]
    ctx.recorder.step("shaping the output", {"kind": "output", "instructions": output.get("instructions", "")})
    try:
        decision, result = ask_model(ctx, messages, purpose="output", schema=output.get("schema"))
    except KeyMissing as missing:
        return needs_key(missing.key_name, "the configured model (to shape the output)", {SHAPE_RESUME: done.summary})
    except NeedsApproval as need:
        return Paused(WaitingFor.APPROVAL, need.summary, resume={SHAPE_RESUME: done.summary},
                      approval=ApprovalRequest(need.kind, need.summary, need.detail, need.guard, need.amount_cents))
    except (NoModel, ModelError) as exc:
        message = str(exc)
        ctx.recorder.event(EventKind.ERROR, f"the output could not be shaped: {message}"[:300], {"kind": "output", "error": message})
        ctx.recorder.save_progress(records={**stored, "resultError": message})
        return done
    shown = ctx.recorder.redactor.redact(result)
    ctx.recorder.output("the output is shaped", {"kind": "output", "result": bounded(shown, chars=20_000),
                                                 "usage": decision.usage.shown()})
    ctx.recorder.save_progress(records={**stored, "result": shown})
    return done
