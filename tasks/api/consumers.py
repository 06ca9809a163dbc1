"""Live streams of the action log (docs/internals/live-log.md#live-updates).

``/ws/tasks/<id>/?after=<seq>`` streams one task's events; ``/ws/tasks/?after=<event id>`` streams
the owner's task list (one frame per changed task). Both follow one rule: the database is the
source of truth. A notification (``channels_redis`` in production) only wakes a consumer, which then
re-reads from its cursor, so frames go out in ``seq`` order and a lost notification loses nothing.
Without a channel layer (the embedded default) the consumer polls the same cheap indexed query.

Frames (JSON):
  {"type": "event", "task": id, "event": {...}}   one action-log line, redacted, in seq order
  {"type": "task", "task": {...}, "cursor": n}    a task's current view (list cursor on /ws/tasks/)
  {"type": "ready", "lastSeq" | "cursor": n}      the backlog is sent; live frames follow

Close codes: 4400 bad cursor, 4401 not signed in, 4403 no access (or no such task: never reveal).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError
from django.db.models import Max, Q

from boxsite.core.errors import NotFound
from boxsite.core.principal import Principal
from boxsite.core.ws_auth import signed_in, still_signed_in
from tasks.api.presenters import present_event, present_task
from tasks.events import owner_group, task_group
from tasks.models import Task, TaskEvent
from tasks.services import get_task_for
from tasks.vault.facts import redactor_for

log = logging.getLogger(__name__)

BATCH = 200
CHECK_EVERY_S = 5.0  # credentials are re-checked this often even when nothing happens
SAFETY_POLL_S = 2.0  # with a channel layer, a slow poll still catches a lost notification
HOLE_TTL_S = 30.0  # how long the list stream waits for an event id that committed late
MAX_HOLES = 10_000

CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


class _Denied(Exception):
    """The connection's credentials or its access to the task no longer hold."""


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """What both streams share: authentication, the wake-up source, and one pump at a time."""

    group = ""
    principal: Principal
    session_key: str | None

    async def connect(self) -> None:
        who = signed_in(self.scope)
        if who is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.principal, self.session_key = who
        self.lock = asyncio.Lock()
        self.poller: asyncio.Task[None] | None = None
        self.last_check = time.monotonic()
        if not await self.open_stream():
            return
        # Join the group before reading the backlog: an event recorded in between then wakes
        # us, instead of falling between the backlog read and the subscription.
        if self.channel_layer is not None:
            await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        if not await self.pump(check=False):
            return
        await self.send_json(self.ready_frame())
        self.poller = asyncio.create_task(self.poll_forever())

    async def disconnect(self, code: int) -> None:
        if self.poller is not None:
            self.poller.cancel()
        if self.channel_layer is not None and self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients only listen; anything they send is ignored."""

    async def poll_forever(self) -> None:
        interval = settings.BOX_LIVE_POLL_SECONDS if self.channel_layer is None else SAFETY_POLL_S
        while True:
            await asyncio.sleep(interval)
            try:
                if not await self.pump(check=time.monotonic() - self.last_check >= CHECK_EVERY_S):
                    return
            except DatabaseError:
                # A busy or restarting database: the cursor is unchanged, so the next tick
                # re-reads exactly what this one would have sent.
                log.warning("live stream read failed; retrying on the next tick", exc_info=True)

    async def pump(self, *, check: bool) -> bool:
        """Send everything after the cursor. False (and the socket closed) once access is gone."""
        async with self.lock:
            try:
                while True:
                    frames, more = await database_sync_to_async(self.read)(check)
                    if check:
                        self.last_check = time.monotonic()
                        check = False
                    for frame in frames:
                        await self.send_json(frame)
                    if not more:
                        return True
            except _Denied:
                await self.close(code=CLOSE_FORBIDDEN)
                return False

    def recheck(self) -> None:
        if not still_signed_in(self.principal, self.session_key):
            raise _Denied
        self.last_check = time.monotonic()

    # --- what each stream defines ---
    async def open_stream(self) -> bool:
        raise NotImplementedError

    def read(self, check: bool) -> tuple[list[dict[str, Any]], bool]:
        """Sync, in a thread: the next frames after the cursor, and whether more are waiting."""
        raise NotImplementedError

    def ready_frame(self) -> dict[str, Any]:
        raise NotImplementedError


def _cursor_param(scope: dict[str, Any], name: str) -> int | None:
    """A non-negative integer from the query string; -1 when it is malformed."""
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    if not values:
        return None
    try:
        value = int(values[0])
    except ValueError:
        return -1
    return value if value >= 0 else -1


class TaskEventsConsumer(LiveConsumer):
    """``/ws/tasks/<id>/?after=<seq>``: that task's events with seq > after, then live ones."""

    async def open_stream(self) -> bool:
        self.task_id = str(self.scope["url_route"]["kwargs"]["task_id"])
        after = _cursor_param(self.scope, "after")
        if after == -1:
            await self.close(code=CLOSE_BAD_REQUEST)
            return False
        self.last_seq = after or 0
        if not await database_sync_to_async(self.may_see)():
            await self.close(code=CLOSE_FORBIDDEN)
            return False
        self.group = task_group(self.task_id)
        return True

    def may_see(self) -> bool:
        try:
            get_task_for(self.principal, self.task_id)
        except NotFound:
            return False
        return still_signed_in(self.principal, self.session_key)

    async def event_new(self, message: dict[str, Any]) -> None:
        # The message body is only a wake-up call; what is sent comes from the database.
        await self.pump(check=False)

    def read(self, check: bool) -> tuple[list[dict[str, Any]], bool]:
        last = Task.objects.filter(pk=self.task_id).values_list("event_seq", flat=True).first()
        if last is None:
            raise _Denied  # the task was deleted (retention) under the stream
        if last <= self.last_seq and not check:
            return [], False  # the cheap path: one primary-key lookup per tick
        # Something will be sent (or a check is due): re-check who is asking and their access
        # to this task right before these events go out.
        self.recheck()
        events = list(TaskEvent.objects.filter(task_id=self.task_id, seq__gt=self.last_seq).order_by("seq")[:BATCH])
        # The task is read after its events, never before: a move that commits in between
        # would otherwise send its own event beside the state before it, and the frame that
        # shows the new state would wait for an event that may never come.
        try:
            task = get_task_for(self.principal, self.task_id)
        except NotFound as exc:
            raise _Denied from exc
        if not events:
            return [], False
        redact = redactor_for(task)
        frames: list[dict[str, Any]] = [
            {"type": "event", "task": task.pk, "event": redact.redact(present_event(e))} for e in events
        ]
        self.last_seq = events[-1].seq
        frames.append({"type": "task", "task": present_task(task)})
        return frames, len(events) == BATCH

    def ready_frame(self) -> dict[str, Any]:
        return {"type": "ready", "task": self.task_id, "lastSeq": self.last_seq}


class TaskListConsumer(LiveConsumer):
    """``/ws/tasks/?after=<event id>``: a frame with the task's current view whenever one of the
    caller's tasks records an event. ``cursor`` is the global event id to reconnect with."""

    async def open_stream(self) -> bool:
        after = _cursor_param(self.scope, "after")
        if after == -1:
            await self.close(code=CLOSE_BAD_REQUEST)
            return False
        self.cursor = after if after is not None else await database_sync_to_async(self.newest_event_id)()
        # On PostgreSQL an event id can commit after a larger one; ids skipped over are
        # remembered for a while so a late commit is still picked up.
        self.holes: dict[int, float] = {}
        if not await database_sync_to_async(still_signed_in)(self.principal, self.session_key):
            await self.close(code=CLOSE_FORBIDDEN)
            return False
        self.group = owner_group(self.principal.user.pk)
        return True

    @staticmethod
    def newest_event_id() -> int:
        return TaskEvent.objects.aggregate(newest=Max("id"))["newest"] or 0

    async def task_changed(self, message: dict[str, Any]) -> None:
        await self.pump(check=False)

    def visible_tasks(self, ids: set[str]) -> list[Task]:
        return list(Task.objects.listed_for(self.principal).filter(pk__in=ids).select_related("workspace"))

    def read(self, check: bool) -> tuple[list[dict[str, Any]], bool]:
        now = time.monotonic()
        self.holes = {i: t for i, t in self.holes.items() if now - t < HOLE_TTL_S}
        query = Q(id__gt=self.cursor)
        if self.holes:
            query |= Q(id__in=list(self.holes))
        rows = list(TaskEvent.objects.filter(query).order_by("id").values_list("id", "task_id")[:BATCH * 5])
        if check:
            self.recheck()
        if not rows:
            return [], False
        expected = self.cursor + 1
        for event_id, _ in rows:
            self.holes.pop(event_id, None)
            if event_id > self.cursor:
                for missing in range(expected, event_id):
                    if len(self.holes) < MAX_HOLES:
                        self.holes[missing] = now
                expected = event_id + 1
        self.cursor = max(self.cursor, rows[-1][0])
        tasks = self.visible_tasks({task_id for _, task_id in rows})
        if tasks:
            self.recheck()  # right before these frames go out
        frames = [{"type": "task", "task": present_task(t), "cursor": self.cursor} for t in tasks]
        return frames, len(rows) == BATCH * 5

    def ready_frame(self) -> dict[str, Any]:
        return {"type": "ready", "cursor": self.cursor}
