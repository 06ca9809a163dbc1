"""One streamed chat completion put back together: text, reasoning, tool calls, usage.

Servers split everything: the text in pieces, a tool call's JSON arguments across many chunks
(its id and name only in the first), the usage in a last chunk with no choices
(``stream_options.include_usage``). Some send reasoning in a ``reasoning_content`` or
``reasoning`` field of the delta; it is kept apart from the answer.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RawCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class Streamed:
    content: str = ""
    reasoning: str = ""
    calls: list[RawCall] = field(default_factory=list)
    finish_reason: str = ""
    usage: Any = None  # the last usage object the stream carried
    chunks: int = 0


def read_stream(stream: Iterable[Any]) -> Streamed:
    """Read ``stream`` (chat-completion chunks) to its end. Faults of the connection go up as
    the client raises them."""
    out = Streamed()
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, RawCall] = {}
    for chunk in stream:
        out.chunks += 1
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            out.usage = usage
        for choice in getattr(chunk, "choices", None) or []:
            if (getattr(choice, "index", 0) or 0) != 0:
                continue
            if choice.finish_reason:
                out.finish_reason = str(choice.finish_reason)
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                content.append(delta.content)
            thought = getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None)
            if isinstance(thought, str) and thought:
                reasoning.append(thought)
            for piece in delta.tool_calls or []:
                _add_piece(calls, piece)
    out.content = "".join(content)
    out.reasoning = "".join(reasoning)
    out.calls = [calls[i] for i in sorted(calls)]
    return out


def _add_piece(calls: dict[int, RawCall], piece: Any) -> None:
    index = getattr(piece, "index", None)
    piece_id = getattr(piece, "id", None) or ""
    if index is None:
        # A server that sends each call whole, without an index: a new id is a new call.
        last = max(calls) if calls else -1
        index = last if last >= 0 and (not piece_id or calls[last].id == piece_id) else last + 1
    call = calls.setdefault(int(index), RawCall())
    if piece_id and not call.id:
        call.id = str(piece_id)
    function = getattr(piece, "function", None)
    if function is not None:
        if function.name and not call.name:
            call.name = str(function.name)
        if function.arguments:
            call.arguments += str(function.arguments)
