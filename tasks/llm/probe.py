"""Settings → Model's "Test connection": can the configured model do what the box asks of it?

Four checks, each ok or failed with a reason in plain words: it answers at all, it calls a
tool, it answers in JSON, and its context window (where the endpoint says it) is large enough
for agent tasks. The context comes from what local servers publish: vLLM's ``max_model_len`` in
``/v1/models``, llama.cpp's ``/props``, Ollama's ``/api/ps`` and ``/api/show``; or from an error
naming it.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Annotated, Any, NotRequired, TypedDict
from urllib.parse import urlsplit, urlunsplit

from boxsite.core.shapes import Doc, Raw
from tasks.llm.client import KeyMissing, ModelConfig, ModelError, TokenUsage, call_model, read_key
from tasks.llm.text import TEXT_CALL, strip_reasoning

# Below this many tokens an agent's rules, tools and a few turns do not fit.
MIN_AGENT_CONTEXT = 8192
PROBE_TIMEOUT_S = 3.0
_CONTEXT_ERROR = re.compile(r"context[ _](?:length|window|size)|maximum context|n_ctx|too many tokens|exceeds? the context",
                            re.IGNORECASE)
_CONTEXT_NUMBER = re.compile(r"(?:context(?:[ _](?:length|window|size))?|n_ctx)\D{0,40}?(\d{3,7})", re.IGNORECASE)
_READY_TOOL = {"type": "function", "function": {
    "name": "report_ready", "description": "Report that you are ready.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}


class Check(TypedDict):
    name: Annotated[str, Raw({"type": "string", "enum": ["answer", "tools", "json", "context"],
                              "description": "what was checked"})]
    ok: bool
    reason: Annotated[str, Doc("what the model did, or plainly what it cannot do")]


class ModelTest(TypedDict):
    ok: Annotated[bool, Doc("every check passed")]
    answer: NotRequired[str]
    error: NotRequired[Annotated[str, Doc("what went wrong; with several failed checks, each reason")]]
    kind: NotRequired[Annotated[str, Raw({"type": "string", "description": "what went wrong",
                                          "enum": ["key", "unreachable", "timeout", "status", "garbage", "arguments",
                                                   "config", "capability"]})]]
    usage: NotRequired[TokenUsage]
    latencyMs: NotRequired[int]
    costCents: NotRequired[float]
    checks: NotRequired[list[Check]]
    contextTokens: NotRequired[Annotated[int, Doc("the context window the endpoint reports, when it does")]]


def check_connection(config: ModelConfig) -> ModelTest:
    """One short call, then one tool call and one JSON answer; each outcome as a check."""
    try:
        key = read_key(config)
    except KeyMissing as exc:
        return {"ok": False, "error": str(exc), "kind": "key",
                "checks": [{"name": "answer", "ok": False, "reason": str(exc)}]}
    timeout_s = min(config.idle_timeout_s, 30.0)
    try:
        first = call_model(config, [{"role": "user", "content": "Reply with the single word: ready"}],
                           key=key, timeout_s=timeout_s, tries=1)
    except ModelError as exc:
        checks: list[Check] = [{"name": "answer", "ok": False, "reason": exc.message}]
        context = _context_from_error(exc.message)
        if context is not None:
            checks.append(_context_check(context))
        return {"ok": False, "error": exc.message, "kind": exc.kind, "checks": checks}
    checks = [{"name": "answer", "ok": True, "reason": f"answered {first.content[:80]!r}"}]
    cost = first.cost_cents
    errors: list[str] = []

    tools_check, spent = _try_tools(config, key, timeout_s, errors)
    checks.append(tools_check)
    cost += spent
    json_check, spent = _try_json(config, key, timeout_s, errors)
    checks.append(json_check)
    cost += spent

    context = _reported_context(config, key)
    if context is None:
        for error in errors:
            context = _context_from_error(error)
            if context is not None:
                break
    checks.append(_context_check(context) if context is not None else
                  {"name": "context", "ok": True, "reason": "the endpoint does not report its context window"})

    result: ModelTest = {"ok": all(c["ok"] for c in checks), "answer": first.content[:500], "usage": first.usage.shown(),
                         "latencyMs": first.latency_ms, "costCents": round(cost, 4), "checks": checks}
    if context is not None:
        result["contextTokens"] = context
    if not result["ok"]:
        result["error"] = "; ".join(c["reason"] for c in checks if not c["ok"])
        result["kind"] = "capability"
    return result


def _try_tools(config: ModelConfig, key: str, timeout_s: float, errors: list[str]) -> tuple[Check, float]:
    ask = [{"role": "user", "content": 'Call the function report_ready with word set to "ready". Do not answer in text.'}]
    try:
        decision = call_model(config, ask, tools=[_READY_TOOL], key=key, timeout_s=timeout_s, tries=1)
    except ModelError as exc:
        errors.append(exc.message)
        if exc.kind in ("garbage", "arguments"):
            return {"name": "tools", "ok": False, "reason": f"does not call tools correctly: {exc.message}"}, 0.0
        return {"name": "tools", "ok": False, "reason": f"does not support tools: {exc.message}"}, 0.0
    if any(call.name == "report_ready" for call in decision.tool_calls):
        return {"name": "tools", "ok": True, "reason": "called the tool"}, decision.cost_cents
    if _calls_as_text(decision.content, "report_ready"):
        # The agent reads a call written as text (tasks.workers.replies); planner and shaping use no tools.
        return {"name": "tools", "ok": True, "reason": "writes its tool calls as text (<tool_call>), which the agent reads "
                "(a local server's tool-call option makes them structured: see docs/guide/models.md)"}, decision.cost_cents
    return {"name": "tools", "ok": False, "reason": "does not support tools: it answered in text instead of calling the tool "
            "(a local server may need its tool-call option: see docs/guide/models.md)"}, decision.cost_cents


def _calls_as_text(content: str, name: str) -> bool:
    """``content`` holds a tool call of ``name`` written as text, whole enough to be run."""
    for match in TEXT_CALL.finditer(strip_reasoning(content)):
        try:
            body = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(body, dict) and body.get("name") == name:
            return True
    return False


def _try_json(config: ModelConfig, key: str, timeout_s: float, errors: list[str]) -> tuple[Check, float]:
    ask = [{"role": "user", "content": 'Answer with the JSON object {"ready": true} and nothing else.'}]
    try:
        decision = call_model(config, ask, schema={"type": "object"}, key=key, timeout_s=timeout_s, tries=1)
    except ModelError as exc:
        errors.append(exc.message)
        return {"name": "json", "ok": False, "reason": f"does not answer in JSON: {exc.message}"}, 0.0
    try:
        answer = decision.json_answer()
    except ModelError as exc:
        return {"name": "json", "ok": False, "reason": f"does not answer in JSON: {exc.message}"}, decision.cost_cents
    if not isinstance(answer, dict):
        return {"name": "json", "ok": False, "reason": "does not answer in JSON: it gave a JSON value that is not an object"}, \
            decision.cost_cents
    return {"name": "json", "ok": True, "reason": "answered in JSON"}, decision.cost_cents


def _context_check(tokens: int) -> Check:
    if tokens < MIN_AGENT_CONTEXT:
        return {"name": "context", "ok": False, "reason": f"context {tokens}: too small for agent tasks (they need at least "
                f"{MIN_AGENT_CONTEXT} tokens; docs/guide/models.md says how to raise it)"}
    return {"name": "context", "ok": True, "reason": f"context {tokens} tokens"}


def _context_from_error(message: str) -> int | None:
    if not _CONTEXT_ERROR.search(message):
        return None
    number = _CONTEXT_NUMBER.search(message)
    return int(number.group(1)) if number else None


def _reported_context(config: ModelConfig, key: str) -> int | None:
    """The context window the server publishes for the model, or ``None``."""
    base = config.base_url.rstrip("/")
    parts = urlsplit(base)
    root = urlunsplit((parts.scheme, parts.netloc, re.sub(r"/v1$", "", parts.path), "", ""))
    models = _get_json(f"{base}/models", key)
    for entry in (models or {}).get("data", []) if isinstance(models, dict) else []:
        if isinstance(entry, dict) and entry.get("id") == config.model:
            for name in ("max_model_len", "context_length", "context_window", "max_context_length"):
                if isinstance(entry.get(name), int):
                    return int(entry[name])
    props = _get_json(f"{root}/props", key)
    if isinstance(props, dict):
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else props.get("n_ctx")
        if isinstance(n_ctx, int):
            return n_ctx
    running = _get_json(f"{root}/api/ps", key)
    for entry in (running or {}).get("models", []) if isinstance(running, dict) else []:
        if isinstance(entry, dict) and entry.get("name", "").split(":")[0] == config.model.split(":")[0] \
                and isinstance(entry.get("context_length"), int):
            return int(entry["context_length"])
    shown = _get_json(f"{root}/api/show", key, {"model": config.model})
    if isinstance(shown, dict):
        found = re.search(r"^num_ctx\s+(\d+)", str(shown.get("parameters", "")), re.MULTILINE)
        if found:
            return int(found.group(1))
    return None


def _get_json(url: str, key: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {key}",
                                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:  # noqa: S310 - the owner's endpoint
            return json.loads(response.read(1_000_000))
    except (urllib.error.URLError, OSError, ValueError):
        return None
