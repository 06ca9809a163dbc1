"""The Content-Security-Policy on every response (Django 5.2 has none built in).

Scripts run only from the box's own files: no inline script, no ``eval``, no other origin, so an
injected ``<script>`` or ``onclick=`` in a page does nothing. Styles may also be inline (the
API docs page's Swagger UI sets them; a style cannot run code). Live streams connect to the same
host over ``ws:``/``wss:``. No page may be framed (clickjacking), and forms post only to the box.
"""
from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"


def policy_for(request: HttpRequest) -> str:
    host = request.get_host()
    return "; ".join((
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        f"connect-src 'self' ws://{host} wss://{host}",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ))


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if HEADER not in response:
            response[HEADER] = policy_for(request)
        return response
