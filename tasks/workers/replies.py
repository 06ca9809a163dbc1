"""Reading what the agent's model answered, as local and reasoning models write it.

A model may think aloud in ``<think>…</think>`` before its answer (that is not the answer), or
write its tool calls as text in the content (Hermes/Qwen style,
``<tool_call>{"name": …, "arguments": …}</tool_call>``) when the server does not parse them into
``tool_calls``. ``read_reply`` gives the answer without the thinking and the calls written as
text, each a ``ToolCall`` like a structured one, or the reason one could not be read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from tasks.llm.client import ToolCall
from tasks.llm.text import TEXT_CALL as _TEXT_CALL
from tasks.llm.text import strip_reasoning


def without_thinking(text: str) -> str:
    """``text`` without its ``<think>``-style reasoning (``tasks.llm.text``)."""
    return strip_reasoning(text)


@dataclass
class Reply:
    text: str  # the content without thinking and without calls written as text
    calls: list[ToolCall] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # calls written as text that could not be read


def read_reply(content: str, *, prefix: str) -> Reply:
    """The answer in ``content`` and the tool calls written in it as text (ids ``prefix-N``)."""
    text = without_thinking(content)
    reply = Reply(text=_TEXT_CALL.sub("", text).strip())
    for n, match in enumerate(_TEXT_CALL.finditer(text)):
        raw = match.group(1)
        try:
            body = json.loads(raw)
            if not isinstance(body, dict) or not isinstance(body.get("name"), str):
                raise ValueError("it has no 'name'")
            arguments = body.get("arguments", body.get("parameters", {}))
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if not isinstance(arguments, dict):
                raise ValueError("its 'arguments' are not an object")
        except ValueError as exc:
            reply.problems.append(f"the tool call written as text is not valid JSON ({exc}): {raw[:200]}")
            continue
        reply.calls.append(ToolCall(id=f"{prefix}-{n + 1}", name=body["name"], arguments=arguments))
    return reply
