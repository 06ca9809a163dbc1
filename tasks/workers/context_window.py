"""Fitting a long agent conversation into the model's context window.

The box counts what it sends (about four characters a token, as the budget does) against the
window (``BOX_MODEL_CONTEXT_TOKENS``) less the answer it asks for. Near the window (``COMPACT_AT``
of it) the older turns are compacted: one model call of its own, logged as a step and charged
like a turn, summarises them; the system prompt (the rules), the task and the recent turns stay
whole. A tool result reaches the model as its head and tail within a budget; the whole of it is
an artifact the model pages through with ``read_output``.
"""
from __future__ import annotations

from typing import Any

from tasks.llm.client import CHARS_PER_TOKEN, OUTPUT_SHARE, context_tokens, prompt_tokens

COMPACT_AT = 0.75  # of the room for input: compact past this
KEEP_RECENT = 0.35  # of the room for input: the recent turns kept whole
RESULT_CHARS = 24000  # the most of one tool result the model is shown (less in a small window)
SUMMARY_MESSAGE_CHARS = 2000  # of each older message, in what the summariser is shown
SUMMARY_PREFIX = "Summary of the earlier turns (compacted to fit the model's context):\n"


def window_tokens(window: int | None = None) -> int:
    """``window`` when the caller has it (the run's ``ModelConfig.context_tokens``, read once as
    the run starts), else the settings' (a read of the settings row)."""
    return window or context_tokens()


def room_tokens(max_output_tokens: int, window: int | None = None) -> int:
    """What the input may use: the window less the answer asked for (at most a quarter of the
    window: ``ModelConfig.output_cap``)."""
    window = window_tokens(window)
    return max(1024, window - min(max_output_tokens, window // OUTPUT_SHARE))


def count_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    return prompt_tokens(messages, tools)


def result_chars(window: int | None = None) -> int:
    """The budget of one tool result, in characters: a tenth of the window at most."""
    return max(2000, min(RESULT_CHARS, window_tokens(window) * CHARS_PER_TOKEN // 10))


def head_and_tail(text: str, budget: int, note: str) -> str:
    """``text`` within ``budget`` characters: its head and its tail, ``note`` between them."""
    if len(text) <= budget:
        return text
    half = max(0, (budget - len(note) - 20) // 2)
    return f"{text[:half]}\n… [{len(text) - 2 * half} characters cut; {note}] …\n{text[-half:]}"


def needs_compaction(messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_output_tokens: int,
                     window: int | None = None) -> bool:
    return count_tokens(messages, tools) > COMPACT_AT * room_tokens(max_output_tokens, window)


def split(messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_output_tokens: int,
          window: int | None = None) -> int | None:
    """Where the recent turns kept whole begin (after the system prompt and the task, index 2 or
    more); None when there is nothing older to compact. The kept part starts at an assistant
    message, so no tool result loses the call it answers."""
    keep = KEEP_RECENT * room_tokens(max_output_tokens, window) - count_tokens(messages[:2], tools)
    start = len(messages)
    used = 0
    for index in range(len(messages) - 1, 1, -1):
        used += count_tokens([messages[index]])
        if used > keep:
            break
        if messages[index].get("role") == "assistant":
            start = index
    if start >= len(messages):  # even the last turn is too large to keep: keep from its assistant message
        start = next((i for i in range(len(messages) - 1, 1, -1) if messages[i].get("role") == "assistant"), len(messages))
    return start if start > 2 else None


def transcript(messages: list[dict[str, Any]], budget_chars: int) -> str:
    """Older messages as text for the summariser, each bounded, the whole within ``budget_chars``
    (the earliest dropped first: the summary of an earlier compaction is among them)."""
    lines = []
    for message in messages:
        role = message.get("role", "")
        text = str(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            text += f"\n[calls {call['function']['name']} {call['function']['arguments']}]"
        if len(text) > SUMMARY_MESSAGE_CHARS:
            text = head_and_tail(text, SUMMARY_MESSAGE_CHARS, "cut")
        lines.append(f"{role}: {text}")
    while lines and sum(len(line) + 1 for line in lines) > budget_chars:
        lines.pop(0)
    return "\n".join(lines)


def summary_request(older: list[dict[str, Any]], max_output_tokens: int, window: int | None = None) -> list[dict[str, Any]]:
    budget = (room_tokens(max_output_tokens, window) * CHARS_PER_TOKEN) // 2
    return [
        {"role": "system", "content": "You compact the earlier part of an agent's work so it can go on in a small context. "
                                      "Write a short summary: what was done, what was found (file names, values, errors), "
                                      "what is left. Keep ${name} placeholders as they are. Plain text, no preamble."},
        {"role": "user", "content": transcript(older, budget)},
    ]
