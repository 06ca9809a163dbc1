"""The built-in model-driven worker. Until a model is configured, a task that needs it waits for
a plan instead of being dropped."""
from __future__ import annotations

from tasks.context import RunContext
from tasks.states import WaitingFor
from tasks.workers.base import Outcome, Paused

NO_MODEL = ("no model is configured, so this plain-language task cannot be planned; "
            "configure a model, or start the task again with a 'flow' or a command worker")


class AgentWorker:
    def run(self, ctx: RunContext) -> Outcome:
        return Paused(WaitingFor.PLAN, NO_MODEL, resume={})
