"""Workers are plugins behind one interface: ``run(ctx) -> Outcome``."""
from __future__ import annotations

from tasks.workers.agent import AgentWorker
from tasks.workers.base import Worker
from tasks.workers.command import CommandWorker
from tasks.workers.flow import FlowWorker
from tasks.workers.presets import all_presets


def worker_for(name: str) -> Worker:
    if name == "flow":
        return FlowWorker()
    if name == "agent":
        return AgentWorker()
    if name == "command" or name in all_presets():
        return CommandWorker()
    raise ValueError(f"unknown worker {name!r}")
