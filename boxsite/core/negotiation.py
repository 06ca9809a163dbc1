"""Views that answer with a file's bytes: whatever type the caller accepts (a file is what it
is, ``Accept: application/octet-stream`` or ``image/*`` included), and their errors in JSON,
the API's error shape. Elsewhere an ``Accept`` the box cannot answer is 406."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

View = TypeVar("View", bound=Callable[..., Any])


class AnyAccept(DefaultContentNegotiation):
    def select_renderer(self, request: Request, renderers: Iterable[BaseRenderer],
                        format_suffix: str | None = None) -> tuple[BaseRenderer, str]:
        first = next(iter(renderers))
        return first, first.media_type  # JSON: used only by an error


def answers_any_type(view: View) -> View:
    """Put under ``@api_view``, which reads the attribute."""
    view.content_negotiation_class = AnyAccept  # type: ignore[attr-defined]
    return view
