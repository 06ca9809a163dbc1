"""Telling the owner: a task that waits for them, fails, or finishes when they asked to be told,
and the ``notify.owner`` tool's message, sent to the Apprise URLs of ``BOX_NOTIFY_URLS`` and
Settings → Notifications (ntfy, Telegram, email, Slack, Matrix, ``json://`` to any webhook...).

Apprise does the sending: each service's protocol is its makers' to keep right. Other channels
(a paired phone's Web Push, ``approvals.push``) sit above this floor and install themselves
(``install_channel``); each message goes to them too. A move only
queues its notice after commit (``queue_move``); one daemon thread per process sends them, so
no move waits for a slow service and none fails because one is down. A delivery that fails is
logged and recorded as a note on the task. Every text passes through the task's redaction, so
no secret fact or vault value leaves in a message.
"""
from __future__ import annotations

import logging
import os
import queue
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import apprise
from django.conf import settings
from django.db import connections, transaction

from boxsite.core.env import env_str
from boxsite.models import BoxSettings
from tasks.events import record_event
from tasks.models import EventKind, Task
from tasks.states import State
from tasks.vault import crypto
from tasks.vault.facts import Redactor, redactor_for

log = logging.getLogger(__name__)

MAX_URLS = 20
MAX_URL = 2000
MAX_BODY = 2000
_SEPARATORS = re.compile(r"\s+")  # not commas: an email URL's ``to=a,b`` holds them

WAITING_WORDS = {
    "approval": "waits for your approval",
    "input": "has a question for you",
    "human": "needs a person (a wall it cannot pass)",
    "checkpoint": "waits at a checkpoint for you",
    "plan": "waits for you to approve its plan",
}


def parse_urls(raw: str) -> list[str]:
    return [url for url in _SEPARATORS.split(raw or "") if url]


def urls_problem(urls: list[str]) -> str | None:
    """Why ``urls`` cannot be the owner's notification URLs (checked by Apprise's own parsing),
    or None."""
    if len(urls) > MAX_URLS:
        return f"at most {MAX_URLS} notification URLs"
    for url in urls:
        if len(url) > MAX_URL or apprise.Apprise.instantiate(url) is None:
            return (f"'{masked(url)}' is not an Apprise URL this box can send to (ntfy://, tgram://, mailto://, "
                    "slack://, matrix://, json://... see the Apprise docs)")
    return None


def masked(url: str) -> str:
    """``url`` as Apprise shows it with its tokens and passwords hidden; the scheme alone when
    Apprise cannot read it."""
    plugin = apprise.Apprise.instantiate(url) if len(url) <= MAX_URL else None
    if plugin is None:
        return url.split(":", 1)[0] + "://…"
    return str(plugin.url(privacy=True))


def stored_urls() -> list[str]:
    """The URLs of Settings → Notifications (encrypted at rest like vault secrets)."""
    sealed = BoxSettings.current().notify_urls_sealed
    if not sealed:
        return []
    return parse_urls(crypto.decrypt(bytes(sealed)))


def seal_urls(urls: list[str]) -> bytes | None:
    return crypto.encrypt("\n".join(urls)) if urls else None


def environment_urls() -> list[str]:
    return parse_urls(env_str("BOX_NOTIFY_URLS", "") or "")


def configured_urls() -> list[str]:
    """Where notices go: ``BOX_NOTIFY_URLS`` and the settings' URLs, each once."""
    seen: dict[str, None] = {}
    for url in [*environment_urls(), *stored_urls()]:
        seen.setdefault(url, None)
    return list(seen)


@dataclass
class Delivery:
    """Where a message went (``sent``) and where it could not go (``failed``), masked."""

    sent: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def delivered(self) -> bool:
        return bool(self.sent)


def send(title: str, body: str, urls: list[str] | None = None) -> Delivery:
    """Send one message to each URL, now, and say where it went. Never raises for a service."""
    delivery = Delivery()
    for url in configured_urls() if urls is None else urls:
        where = masked(url)
        plugin = apprise.Apprise.instantiate(url)
        try:
            ok = plugin is not None and bool(plugin.notify(body=body[:MAX_BODY], title=title))
        except Exception:  # noqa: BLE001 - one broken service never stops the others or the caller
            log.warning("notification to %s raised", where, exc_info=True)
            ok = False
        (delivery.sent if ok else delivery.failed).append(where)
    if delivery.failed:
        log.warning("notification %r not delivered to %s", title, ", ".join(delivery.failed))
    return delivery


class Channel(Protocol):
    """A way to the owner besides Apprise, installed by the app that keeps it."""

    def wanted(self) -> bool:
        """Whether there is anyone to tell through it (a cheap check, made before a task is read)."""
        ...

    def tell(self, task: Task, title: str, detail: str) -> Delivery:
        """Send ``title`` and ``detail`` (both redacted) about ``task``; never raises for a service."""
        ...


_CHANNELS: list[Channel] = []


def install_channel(channel: Channel) -> None:
    """Called once by the app keeping ``channel`` when the apps are ready."""
    if channel not in _CHANNELS:
        _CHANNELS.append(channel)


def task_link(task_id: str) -> str:
    base = settings.BOX_PUBLIC_URL or f"http://{settings.BOX_HOST}:{settings.BOX_PORT}"
    return f"{base.rstrip('/')}/tasks/{task_id}"


def message_for(task: Task, *, redactor: Redactor | None = None) -> tuple[str, str] | None:
    """The title and detail telling the owner where ``task`` stands, or None when it is nothing to
    tell (running, or done without the owner asking to be told)."""
    if task.state == State.WAITING:
        what = WAITING_WORDS.get(task.waiting_for, f"waits for you ({task.waiting_for or 'something'})")
        detail = str((task.pause or {}).get("message") or "")
    elif task.state == State.FAILED:
        what, detail = "failed", task.error
    elif task.state == State.DONE and wants_done(task):
        what, detail = "is done", ""
    else:
        return None
    redact = redactor or redactor_for(task)
    return redact.text(f"Task “{task.title}” {what}"), redact.text(detail)


def wants_done(task: Task) -> bool:
    return bool((task.notify or {}).get("done"))


def deliver_for_task(task: Task, title: str, detail: str, *, redactor: Redactor | None = None,
                     note_failure: bool = True) -> Delivery:
    """Send a message about ``task`` (redacted) to the Apprise URLs, its link after ``detail``,
    and through every installed channel; a failure becomes a note on the task
    (``note_failure=False``: the caller records it, as a run's tool call does under its lease)."""
    redact = redactor or redactor_for(task)
    title, detail = redact.text(title), redact.text(detail)
    delivery = send(title, "\n".join(part for part in (detail, f"Open it: {task_link(task.pk)}") if part))
    for channel in _CHANNELS:
        told = channel.tell(task, title, detail)
        delivery.sent += told.sent
        delivery.failed += told.failed
    if delivery.failed and note_failure:
        try:
            with transaction.atomic():
                record_event(task, EventKind.NOTE, f"could not notify the owner at {', '.join(delivery.failed)}",
                             {"notify": {"failed": delivery.failed, "sent": delivery.sent}}, redactor=redact)
        except Exception:  # noqa: BLE001 - the note is a courtesy; the log line above already says it
            log.warning("could not record the failed notification of task %s", task.pk, exc_info=True)
    return delivery


def _notify_move(task_id: str, version: int) -> None:
    if not configured_urls() and not any(channel.wanted() for channel in _CHANNELS):
        return
    task = Task.objects.filter(pk=task_id).first()
    if task is None or task.version != version:
        return  # it moved on meanwhile: that move queued its own notice
    message = message_for(task)
    if message is not None:
        deliver_for_task(task, *message)


class _Sender:
    """This process's one thread that sends notices in order, off every request and run. A
    forked child (a django-q2 worker) starts its own on first use."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._queue: queue.Queue[Callable[[], None]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def put(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="box-notify", daemon=True)
                self._thread.start()
        self._queue.put(job)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                job()
            except Exception:  # noqa: BLE001 - a notice never takes the sender down
                log.warning("a notification failed", exc_info=True)
            finally:
                connections.close_all()  # notices are rare: no connection is held between them
                self._queue.task_done()

    def wait_sent(self) -> None:
        """Until everything queued so far was sent (tests, and a process about to end)."""
        self._queue.join()


SENDER = _Sender()


def queue_move(task: Task) -> None:
    """After commit, tell the owner about ``task``'s move if it is one they hear of (waiting,
    failed, done when asked) and a URL is set. Call inside the move's transaction."""
    if task.state not in (State.WAITING, State.FAILED, State.DONE):
        return
    if task.state == State.DONE and not wants_done(task):
        return
    task_id, version = task.pk, task.version
    transaction.on_commit(lambda: SENDER.put(lambda: _notify_move(task_id, version)))


def describe(delivery: Delivery) -> dict[str, Any]:
    return {"delivered": delivery.delivered, "to": delivery.sent, "failed": delivery.failed}
