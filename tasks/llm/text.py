"""A model's answer without its reasoning, and the JSON value inside an answer.

Reasoning models (DeepSeek-R1, Qwen3, QwQ, gpt-oss behind some servers) write their thinking into
the answer between ``<think>`` tags, or only close the tag because the chat template opened it.
Neither the owner nor a JSON parser should see it. ``call_model`` strips every answer it returns;
the agent, the planner and output shaping read JSON through ``json_text``. A tool call written
as text (``<tool_call>{"name": …}</tool_call>``) is found by ``TEXT_CALL``.
"""
from __future__ import annotations

import re

_TAGS = ("think", "thinking", "reasoning", "reflection")
_BLOCK = re.compile(r"<(%s)\b[^>]*>.*?</\1\s*>" % "|".join(_TAGS), re.DOTALL | re.IGNORECASE)
_OPEN = re.compile(r"<(%s)\b[^>]*>" % "|".join(_TAGS), re.IGNORECASE)
_CLOSE = re.compile(r"</(%s)\s*>" % "|".join(_TAGS), re.IGNORECASE)
# A tool call written as text, Hermes/Qwen style, as local servers without a tool-call parser pass it on.
TEXT_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(</tool_call>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*(?:json[c5]?|javascript|js)?[ \t]*\n?(.*?)```", re.DOTALL | re.IGNORECASE)


def split_reasoning(text: str) -> tuple[str, str]:
    """``(answer, reasoning)``: the text with its reasoning blocks taken out, and those blocks."""
    reasoning: list[str] = []

    def keep(match: re.Match[str]) -> str:
        reasoning.append(_CLOSE.sub("", _OPEN.sub("", match.group(0), count=1)).strip())
        return ""

    answer = _BLOCK.sub(keep, text)
    close = _CLOSE.search(answer)
    if close is not None and not _OPEN.search(answer[:close.start()]):
        # The template opened the block, the model only closed it: all before the close is thought.
        reasoning.append(answer[:close.start()].strip())
        answer = answer[close.end():]
    opened = _OPEN.search(answer)
    if opened is not None:
        # Cut off while thinking (the output cap): no answer follows the open tag.
        reasoning.append(answer[opened.end():].strip())
        answer = answer[:opened.start()]
    return answer.strip(), "\n\n".join(r for r in reasoning if r)


def strip_reasoning(text: str) -> str:
    """The answer without its ``<think>``-style reasoning."""
    return split_reasoning(text)[0]


def json_text(text: str) -> str:
    """The JSON inside a model's answer: reasoning stripped, a fenced block unwrapped, and
    otherwise the span from the first ``{``/``[`` to the last matching bracket (a model's
    "Here is the JSON:" before it). The caller parses it."""
    answer = strip_reasoning(text)
    fenced = _FENCE.search(answer)
    if fenced is not None:
        return fenced.group(1).strip()
    stripped = answer.strip()
    if not stripped or stripped[0] in "{[\"" or stripped[0].isdigit() or stripped in ("true", "false", "null"):
        return stripped
    starts = [i for i in (stripped.find("{"), stripped.find("[")) if i >= 0]
    if not starts:
        return stripped
    start = min(starts)
    end = stripped.rfind("}" if stripped[start] == "{" else "]")
    return stripped[start:end + 1] if end > start else stripped
