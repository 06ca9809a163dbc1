"""Django's ASGI handler, with each request's sync work in one step on a thread that stays.

Django's own handler builds an async middleware chain: every sync-capable middleware
(``MiddlewareMixin``: sessions, CSRF, auth, messages, security headers) then moves its
``process_request`` and ``process_response`` to the request's thread and back, and the view one
more time: about fifteen handoffs between the event loop and the thread per request, each a few
futures, a context copy and a thread wake-up. And each request gets a thread of its own, started
for it and joined after, with a database connection opened and closed in it. Every view and
middleware of the box is sync, so here the chain is built sync and runs in one handoff, on one of
a few threads kept for the process's life, which keeps the web process's CPU per request low.

A request runs on the least busy thread; Django's request signals, its response streaming and the
request's thread-sensitive calls all stay on that thread, as they stay on Django's per-request
thread.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest, HttpResponseBase, JsonResponse

from boxsite.core.errors import InvalidRequest


def _create_request_guarded(self: ASGIHandler, scope: Mapping[str, Any],
                            body_file: Any) -> tuple[ASGIRequest, None] | tuple[None, HttpResponseBase]:
    """Django's ``create_request``, and a charset Python cannot look up at all ("utf-8\\x00" is a
    ValueError, not the LookupError Django expects, raised before any middleware) answered 400,
    not a 500. Both handlers use it: the box's own and the one in front that serves /static/."""
    try:
        return ASGIHandler.create_request(self, scope, body_file)
    except ValueError:
        error = InvalidRequest("the Content-Type's charset is not a name", field="Content-Type")
        return None, JsonResponse(error.as_dict(), status=error.status)


class StaticFilesHandler(ASGIStaticFilesHandler):
    """Django's /static/ handler (the portal's few CSS and JS files), with the charset guard."""

    create_request = _create_request_guarded


class Lane:
    """One thread, and how many requests are on it now."""

    def __init__(self, n: int) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"web-{n}")
        self.busy = 0


class OneStepASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self.lanes = [Lane(n) for n in range(settings.BOX_WEB_THREADS)]

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        lane = min(self.lanes, key=lambda one: one.busy)
        lane.busy += 1
        try:
            async with ThreadSensitiveContext(executor=lane.executor):
                await self.handle(scope, receive, send)
        finally:
            lane.busy -= 1

    create_request = _create_request_guarded

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        """The sync chain (``BaseHandler.get_response``), in one step on the request's thread."""
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
