"""What a worker gets: the task, its working directory, facts, and the step recorder."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.models import Run, Task
from tasks.run.recorder import StepRecorder
from tasks.tools.http import http_request
from tasks.vault.facts import Facts


@dataclass
class RunContext:
    task: Task
    run: Run
    workdir: Path
    facts: Facts
    recorder: StepRecorder
    deadline: float | None = None  # monotonic; from max_elapsed_ms minus what earlier runs used
    stop: threading.Event = field(default_factory=threading.Event)  # set when the lease is lost
    # Time a live process spent held waiting for the owner (tasks.broker.holds) is not running
    # time: it neither uses up max_elapsed_ms nor counts in spent.elapsed_ms.
    held_s: float = 0.0
    held_since: float | None = None
    # Called before each process the run starts (tasks.sandbox.launcher): opens the run's broker
    # the first time (tasks.broker.server.serving).
    before_process: Callable[[], None] | None = None
    # The run's resident sandbox init (tasks.sandbox.resident.serving): its commands are forked
    # by one init inside the task's namespaces instead of each starting its own.
    resident: Any = None

    @property
    def resume(self) -> dict[str, Any]:
        return self.run.resume or {}

    def time_left(self) -> float | None:
        if self.deadline is None:
            return None
        now = self.held_since if self.held_since is not None else time.monotonic()
        return self.deadline + self.held_s - now

    def hold(self) -> None:
        self.held_since = time.monotonic()

    def unhold(self) -> None:
        if self.held_since is not None:
            self.held_s += time.monotonic() - self.held_since
            self.held_since = None

    def refresh_redactor(self) -> None:
        """Rebuild the log's redactor from the current facts and vault; call whenever the run
        was handed a new secret (an answered question, a key read from the vault)."""
        self.recorder.redactor = self.facts.redactor()

    def note(self, summary: str, data: dict[str, Any] | None = None) -> None:
        self.recorder.note(summary, data)

    def http(self, method: str, url: str, *, headers: dict[str, str], body: Any = None) -> dict[str, Any]:
        return http_request(self, method, url, headers=headers, body=body)
