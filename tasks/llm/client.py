"""The model: one OpenAI-compatible chat-completions endpoint, configured in one place.

``current_config`` reads Settings → Model (``BoxSettings``) over the ``BOX_MODEL_*`` environment.
``call_model`` is the one way the box asks the model something: messages (and tools, or a JSON
Schema for the answer) in, a ``Decision`` with its ``Usage`` out. Every model-driven part calls
it: the agent worker, ``model`` flow steps, the planner, the rescuer, output shaping, the
browser's grounding. The API key is read from the vault here, in the worker process, and never
enters a task's sandbox.

A call is streamed (``tasks.llm.stream``) with a timeout between chunks, not over the whole
answer, so a slow local model is not cut while it is still writing. A call that meets a
transient fault (429, 5xx, a timeout, a dropped connection) is tried again with backoff
(``tasks.llm.retry``) before ``ModelError`` goes up; only the attempt that answered is charged.
A parameter an endpoint refuses by name (``max_completion_tokens``, ``reasoning_effort``,
``stream_options``) is swapped or dropped at once, and remembered for that endpoint and model.

Callers pass messages that are already redacted (``tasks.vault.facts.Redactor``): this module sends
what it is given.
"""
from __future__ import annotations

import ipaddress
import json
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, Protocol, TypedDict
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from boxsite.core.errors import InvalidRequest
from boxsite.core.shapes import Doc
from boxsite.models import BoxSettings
from tasks.llm import retry
from tasks.llm.stream import Streamed, read_stream
from tasks.llm.text import json_text, split_reasoning
from tasks.vault.store import read_secret, set_secret, validate_name

if TYPE_CHECKING:
    import openai

# A rough count of tokens for the budget's look-ahead: about four characters a token.
CHARS_PER_TOKEN = 4
OUTPUT_SHARE = 4  # the output asked for is at most a quarter of the context window


def prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """What a request's messages and tools count, at four characters a token."""
    chars = len(json.dumps(messages)) + (len(json.dumps(tools)) if tools else 0)
    return chars // CHARS_PER_TOKEN + 1


class NoModel(Exception):
    """No model is configured (no base URL or no model name)."""


class KeyMissing(Exception):
    """The configured model needs a key the vault does not hold."""

    def __init__(self, key_name: str) -> None:
        super().__init__(f"the vault has no {key_name}, the key of the configured model")
        self.key_name = key_name


class ModelError(Exception):
    """The endpoint could not be reached, refused, timed out or answered something unusable."""

    def __init__(self, message: str, *, kind: str, status: int | None = None, retry_after_s: float | None = None,
                 transient: bool = False, decision: Decision | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind  # unreachable, timeout, status, garbage, schema, arguments (a tool call's: the model's to fix)
        self.status = status
        self.retry_after_s = retry_after_s  # what the endpoint asked for (Retry-After)
        self.transient = transient  # worth trying again: 429, 5xx, a timeout, a dropped connection
        # With kind "arguments": the answer as given (its usage and cost, to be charged; the broken
        # calls carry their ``problem``), so the caller can pay for it and answer each call.
        self.decision = decision


REASONING_EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class ModelConfig:
    base_url: str
    model: str
    key_name: str  # the vault secret holding the key; "" when the endpoint takes none
    input_cents_per_million: float = 0.0
    output_cents_per_million: float = 0.0
    idle_timeout_s: float = 120.0  # the longest silence between two chunks of an answer
    max_output_tokens: int = 8192
    cached_input_cents_per_million: float | None = None  # None: cached input costs the input price
    reasoning_effort: str = ""  # "", or one of REASONING_EFFORTS, sent as reasoning_effort
    context_tokens: int | None = None  # the model's window; None: unknown, the output cap is sent as it is

    def cost_cents(self, usage: Usage) -> float:
        """What ``usage`` costs, in (fractional) cents: cached input at the cached price."""
        cached = min(usage.cached_input_tokens, usage.input_tokens)
        cached_price = self.input_cents_per_million if self.cached_input_cents_per_million is None \
            else self.cached_input_cents_per_million
        return ((usage.input_tokens - cached) * self.input_cents_per_million + cached * cached_price
                + usage.output_tokens * self.output_cents_per_million) / 1_000_000

    @property
    def is_local(self) -> bool:
        """The endpoint is on this machine (a loopback address): a local server, keyless unless
        the vault holds its key."""
        return is_loopback(self.base_url)

    def estimate_cents(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """An upper guess of what one call with ``messages`` costs, in whole cents: its input
        counted at four characters a token, and the longest answer it may give."""
        prompt = prompt_tokens(messages, tools)
        guess = Usage(input_tokens=prompt, output_tokens=self.output_tokens(prompt))
        return math.ceil(self.cost_cents(guess))

    @property
    def output_cap(self) -> int:
        """The most output a call asks for: ``max_output_tokens``, but at most a quarter of the
        window, so a small window keeps most of itself for the conversation."""
        if not self.context_tokens:
            return self.max_output_tokens
        return max(1, min(self.max_output_tokens, self.context_tokens // OUTPUT_SHARE))

    def output_tokens(self, prompt: int) -> int:
        """The output asked for with a prompt of ``prompt`` tokens: the cap, and no more than
        the window leaves (servers such as vLLM refuse prompt + requested output past it)."""
        if not self.context_tokens:
            return self.output_cap
        return max(1, min(self.output_cap, self.context_tokens - prompt))

    def shown(self) -> dict[str, Any]:
        return {"baseUrl": self.base_url, "model": self.model, "keyName": self.key_name,
                "inputCentsPerMillion": self.input_cents_per_million,
                "outputCentsPerMillion": self.output_cents_per_million}


def is_loopback(base_url: str) -> bool:
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TokenUsage(TypedDict):
    """the tokens a model call used, as the endpoint reported them (or as estimated)"""

    inputTokens: int
    outputTokens: int
    cachedInputTokens: NotRequired[Annotated[int, Doc("of inputTokens, those the endpoint served from its cache")]]
    estimated: NotRequired[Annotated[bool, Doc("the endpoint reported no usage: counted from characters, four a token")]]


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0  # of input_tokens, those the endpoint served from its cache
    estimated: bool = False  # the endpoint reported none: counted from characters, four a token

    def shown(self) -> TokenUsage:
        shown: TokenUsage = {"inputTokens": self.input_tokens, "outputTokens": self.output_tokens}
        if self.cached_input_tokens:
            shown["cachedInputTokens"] = self.cached_input_tokens
        if self.estimated:
            shown["estimated"] = True
        return shown


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    problem: str = ""  # why the call cannot run as written (its arguments are not a JSON object)

    def message(self) -> dict[str, Any]:
        """As the assistant message carries it back to the model."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments)}}


@dataclass(frozen=True)
class Decision:
    """What the model answered: text, tool calls, or both; what it used and cost."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    cost_cents: float = 0.0
    finish_reason: str = ""
    latency_ms: int = 0
    reasoning: str = ""  # the model's thinking, taken out of the answer (never sent back)
    attempts: int = 1  # the tries it took; only the last one answered and is charged

    def message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            out["tool_calls"] = [c.message() for c in self.tool_calls]
        return out

    def shown(self) -> dict[str, Any]:
        shown = {"content": self.content, "toolCalls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls],
                 "finishReason": self.finish_reason, "usage": self.usage.shown(), "latencyMs": self.latency_ms}
        if self.reasoning:
            shown["reasoning"] = self.reasoning[:4000]
        if self.attempts > 1:
            shown["attempts"] = self.attempts
        return shown

    def json_answer(self) -> Any:
        """The content read as JSON (reasoning stripped, a fenced block unwrapped:
        ``tasks.llm.text.json_text``); ``ModelError`` when it is not."""
        try:
            return json.loads(json_text(self.content))
        except ValueError as exc:
            raise ModelError(f"the model's answer is not JSON: {self.content[:200]!r}", kind="garbage") from exc


def current_config() -> ModelConfig:
    """The model in force: Settings → Model, each field falling back to its environment
    variable. ``NoModel`` when no base URL or model name is set."""
    row = BoxSettings.current()
    base_url = row.model_base_url or settings.BOX_MODEL_BASE_URL
    model = row.model_name or settings.BOX_MODEL_NAME
    if not base_url or not model:
        raise NoModel("no model is configured: set its base URL and name in Settings → Model")
    return ModelConfig(
        base_url=base_url, model=model,
        key_name=row.model_key_name if row.model_key_name is not None else settings.BOX_MODEL_KEY_NAME,
        input_cents_per_million=_price(row.model_input_cents_per_million, settings.BOX_MODEL_INPUT_CENTS_PER_MILLION),
        output_cents_per_million=_price(row.model_output_cents_per_million, settings.BOX_MODEL_OUTPUT_CENTS_PER_MILLION),
        idle_timeout_s=float(settings.BOX_MODEL_IDLE_TIMEOUT_S), max_output_tokens=int(settings.BOX_MODEL_MAX_OUTPUT_TOKENS),
        cached_input_cents_per_million=_cached_price(row.model_cached_input_cents_per_million,
                                                     settings.BOX_MODEL_CACHED_INPUT_CENTS_PER_MILLION),
        reasoning_effort=(row.model_reasoning_effort if row.model_reasoning_effort is not None
                          else settings.BOX_MODEL_REASONING_EFFORT) or "",
        context_tokens=int(row.model_context_tokens or settings.BOX_MODEL_CONTEXT_TOKENS),
    )


def _price(own: float | None, default: float) -> float:
    return float(own) if own is not None else float(default)


def _cached_price(own: float | None, default: float | None) -> float | None:
    return float(own) if own is not None else default


def read_key(config: ModelConfig) -> str:
    """The key to send; ``KeyMissing`` when the config names a vault secret that is not set,
    unless the endpoint is local (a loopback address): local servers mostly take no key."""
    if not config.key_name:
        return NO_KEY
    key = read_secret(config.key_name)
    if key is None:
        if config.is_local:
            return NO_KEY
        raise KeyMissing(config.key_name)
    return key


NO_KEY = "none"  # the client insists on one; a keyless server ignores it


class AttemptRecorder(Protocol):
    """Where a failed attempt is logged: a run's recorder (``tasks.run.recorder.Recorder``)."""

    def event(self, kind: str, summary: str, data: dict[str, Any] | None = None) -> None: ...


def call_model(config: ModelConfig, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
               schema: dict[str, Any] | None = None, key: str | None = None, timeout_s: float | None = None,
               recorder: AttemptRecorder | None = None, tries: int | None = None) -> Decision:
    """One chat completion, tried again on transient faults. ``tools``: function tools the model
    may call; ``schema``: a JSON Schema its answer must follow (asked for as a JSON object; the
    caller validates it); ``timeout_s``: the longest silence between chunks (the config's idle
    timeout by default); ``recorder``: each failed attempt is logged there as a note;
    ``tries``: at most this many attempts (``BOX_MODEL_RETRY_TRIES`` by default).
    Raises ``ModelError`` once the tries or their time are used up, or ``KeyMissing``."""
    client = _client(config.base_url, key if key is not None else read_key(config))
    idle_s = timeout_s or config.idle_timeout_s
    policy = retry.Policy.current()
    if tries is not None:
        policy = replace(policy, tries=max(1, tries))
    started = time.monotonic()
    attempt = 0
    adjusted: set[str] = set()
    while True:
        attempt += 1
        request = _request(config, messages, tools, schema, idle_s)
        try:
            decision = _attempt(client, config, request, idle_s)
            return replace(decision, attempts=attempt) if attempt > 1 else decision
        except ModelError as exc:
            refused = _refused_parameter(exc, request)
            if refused is not None and refused not in adjusted:
                # Not a fault of the endpoint: the request is changed and sent again at once.
                adjusted.add(refused)
                _remember(config, refused)
                attempt -= 1
                continue
            wait = policy.next_wait(attempt, started, exc.retry_after_s) if exc.transient else None
            if wait is None:
                if attempt > 1:
                    exc.message = f"{exc.message} ({attempt} tries)"
                    exc.args = (exc.message,)
                raise
            if recorder is not None:
                recorder.event("note", f"the model call failed (try {attempt} of {policy.tries}): {exc.message}; "
                               f"trying again in {wait:.1f} s",
                               {"modelAttempt": attempt, "error": exc.message, "errorKind": exc.kind, "status": exc.status,
                                "waitS": round(wait, 2), "retryAfterS": exc.retry_after_s})
            time.sleep(wait)


# Per endpoint and model, the request parameters it refused: "max_completion_tokens" (it takes
# max_tokens), "reasoning_effort", "stream_options". Kept for the process.
_refusals: dict[tuple[str, str], set[str]] = {}
_refusals_lock = threading.Lock()


def _refused(config: ModelConfig) -> set[str]:
    with _refusals_lock:
        return set(_refusals.get((config.base_url, config.model), ()))


def _remember(config: ModelConfig, parameter: str) -> None:
    with _refusals_lock:
        known = _refusals.setdefault((config.base_url, config.model), set())
        if parameter == "max_tokens":
            known.discard("max_completion_tokens")
        else:
            known.add(parameter)


def _request(config: ModelConfig, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             schema: dict[str, Any] | None, idle_s: float) -> dict[str, Any]:
    refused = _refused(config)
    cap = "max_tokens" if "max_completion_tokens" in refused else "max_completion_tokens"
    # A float timeout bounds each read, so it is the silence allowed between two chunks.
    request: dict[str, Any] = {"model": config.model, "messages": messages,
                               cap: config.output_tokens(prompt_tokens(messages, tools)),
                               "stream": True, "timeout": idle_s}
    if "stream_options" not in refused:
        request["stream_options"] = {"include_usage": True}
    if config.reasoning_effort and "reasoning_effort" not in refused:
        request["reasoning_effort"] = config.reasoning_effort
    if tools:
        request["tools"] = tools
    if schema is not None and "response_format" not in refused:
        request["response_format"] = {"type": "json_object"}
    return request


_REFUSAL_WORDS = ("unsupported", "not supported", "unrecognized", "unknown", "not permitted", "not allowed",
                  "extra inputs", "extra_forbidden", "use 'max_completion_tokens'", "use max_completion_tokens")


def _refused_parameter(exc: ModelError, request: dict[str, Any]) -> str | None:
    """The optional parameter a 400 refuses by name, or ``None``. ``max_tokens`` means the
    endpoint wants ``max_completion_tokens`` back."""
    if exc.status not in (400, 422):
        return None
    text = exc.message.lower()
    if not any(word in text for word in _REFUSAL_WORDS):
        return None
    for name in ("max_completion_tokens", "stream_options", "reasoning_effort", "response_format"):
        if name in request and name in text:
            if name == "max_completion_tokens" and "use 'max_completion_tokens'" in text:
                continue
            return name
    if "max_tokens" in request and "max_tokens" in text:
        return "max_tokens"
    return None


def _attempt(client: openai.OpenAI, config: ModelConfig, request: dict[str, Any], idle_s: float) -> Decision:
    import openai  # noqa: PLC0415 - large in every process that imports it: only where a model is called

    began = time.monotonic()
    try:
        # The body goes as extra_body (which takes precedence over the arguments): the client would
        # otherwise walk every message and tool against its typed schema on each call, a cost that
        # grows with the conversation, for a body that is plain JSON already.
        body = {k: v for k, v in request.items() if k not in ("model", "stream", "timeout")}
        streamed = read_stream(client.chat.completions.create(model=request["model"], messages=[], stream=True,
                                                              timeout=request["timeout"], extra_body=body))
    except openai.APITimeoutError as exc:
        raise ModelError(f"the model did not answer within {idle_s:g} s", kind="timeout", transient=True) from exc
    except openai.APIConnectionError as exc:
        raise ModelError(f"the model's endpoint cannot be reached ({config.base_url}): {_cause(exc)}", kind="unreachable",
                         transient=True) from exc
    except openai.APIStatusError as exc:
        raise _status_error(exc) from exc
    except (openai.APIError, ValueError, TypeError) as exc:
        raise ModelError(f"the model's endpoint answered something that is not a chat completion: {exc}", kind="garbage") from exc
    latency_ms = int((time.monotonic() - began) * 1000)
    return _decision(config, streamed, latency_ms, prompt_tokens(request["messages"], request.get("tools")))


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{exc} ({cause})" if cause is not None and str(cause) else str(exc)


def _status_error(exc: openai.APIStatusError) -> ModelError:
    status = int(exc.status_code)
    text = _error_text(exc)
    transient = status in retry.TRANSIENT_STATUSES or status >= 500
    if status == 429 and any(code in json.dumps(exc.body or "") for code in retry.FINAL_429_CODES):
        transient = False
    return ModelError(f"the model's endpoint answered HTTP {status}: {text}", kind="status", status=status,
                      retry_after_s=retry.retry_after_s(exc.response.headers) if transient else None, transient=transient)


_clients: dict[tuple[str, str], openai.OpenAI] = {}
_clients_lock = threading.Lock()


def _client(base_url: str, key: str) -> openai.OpenAI:
    """One client per endpoint and key, kept for the process: making one builds a TLS context,
    which costs more than a local model's whole answer. Its own retries are off: ``call_model``
    retries, logging each attempt."""
    import openai  # noqa: PLC0415 - see _attempt

    with _clients_lock:
        client = _clients.get((base_url, key))
        if client is None:
            if len(_clients) >= 8:
                _clients.clear()
            client = _clients[(base_url, key)] = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        return client


def _error_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
        if isinstance(inner, str) and inner:
            return inner[:300]  # Ollama and llama.cpp: {"error": "..."}
    return str(exc.message)[:300]


def _decision(config: ModelConfig, streamed: Streamed, latency_ms: int, prompt: int) -> Decision:
    """The answer read from ``streamed``; a call whose arguments are not a JSON object raises
    ``ModelError`` (kind "arguments") carrying the whole answer, each broken call with its problem."""
    if streamed.chunks == 0:
        raise ModelError("the model's endpoint answered something that is not a chat completion (no data in the stream)",
                         kind="garbage")
    calls: list[ToolCall] = []
    broken = ""
    for raw in streamed.calls:
        call_id = raw.id or f"call_{len(calls)}"
        try:
            arguments = json.loads(raw.arguments or "{}")
            problem = "" if isinstance(arguments, dict) else "are not a JSON object"
        except ValueError:
            problem = "are not JSON"
        if problem:
            broken = broken or f"the model called {raw.name} with arguments that {problem}"
            problem = (f"the arguments of {raw.name} {problem}: {raw.arguments[:300]!r}; "
                       "call it again with its arguments as one JSON object")
            arguments = {}
        calls.append(ToolCall(id=call_id, name=raw.name, arguments=arguments, problem=problem))
    content, thought = split_reasoning(streamed.content)
    reasoning = "\n\n".join(r for r in (streamed.reasoning.strip(), thought) if r)
    usage = _usage(streamed.usage)
    if usage is None:
        # Never free: the endpoint said nothing, so the answer is counted as the budget counts it.
        written = len(streamed.content) + len(streamed.reasoning) + sum(len(c.name) + len(c.arguments) for c in streamed.calls)
        usage = Usage(input_tokens=prompt, output_tokens=written // CHARS_PER_TOKEN + 1, estimated=True)
    decision = Decision(content=content, tool_calls=calls, usage=usage, cost_cents=config.cost_cents(usage),
                        finish_reason=streamed.finish_reason, latency_ms=latency_ms, reasoning=reasoning)
    if broken:
        raise ModelError(broken, kind="arguments", decision=decision)
    return decision


def _usage(raw: Any) -> Usage | None:
    if raw is None:
        return None
    details = getattr(raw, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", 0) if details is not None else 0
    return Usage(input_tokens=int(getattr(raw, "prompt_tokens", 0) or 0),
                 output_tokens=int(getattr(raw, "completion_tokens", 0) or 0),
                 cached_input_tokens=int(cached or 0))


# --- Settings → Model ------------------------------------------------------------------------
_SETTING_FIELDS = {"baseUrl": "model_base_url", "model": "model_name", "keyName": "model_key_name",
                   "inputCentsPerMillion": "model_input_cents_per_million",
                   "outputCentsPerMillion": "model_output_cents_per_million",
                   "cachedInputCentsPerMillion": "model_cached_input_cents_per_million",
                   "reasoningEffort": "model_reasoning_effort", "contextTokens": "model_context_tokens"}
_ENV = {"baseUrl": "BOX_MODEL_BASE_URL", "model": "BOX_MODEL_NAME", "keyName": "BOX_MODEL_KEY_NAME",
        "inputCentsPerMillion": "BOX_MODEL_INPUT_CENTS_PER_MILLION", "outputCentsPerMillion": "BOX_MODEL_OUTPUT_CENTS_PER_MILLION",
        "cachedInputCentsPerMillion": "BOX_MODEL_CACHED_INPUT_CENTS_PER_MILLION", "reasoningEffort": "BOX_MODEL_REASONING_EFFORT",
        "contextTokens": "BOX_MODEL_CONTEXT_TOKENS"}
MIN_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS = 2048, 10_000_000
MAX_PRICE = 1_000_000.0  # cents per million tokens ($10,000): anything above is a typo


class ModelSettings(TypedDict):
    configured: Annotated[bool, Doc("a base URL and a model name are set (here or in the environment)")]
    baseUrl: str
    model: str
    keyName: Annotated[str, Doc("the vault secret holding the API key; empty: the endpoint takes none")]
    keySet: Annotated[bool, Doc("the vault holds keyName")]
    keyNeeded: Annotated[bool, Doc("a task asks for the key when the vault lacks it (false for a loopback endpoint)")]
    inputCentsPerMillion: float
    outputCentsPerMillion: float
    cachedInputCentsPerMillion: Annotated[float | None, Doc("the price of input tokens the endpoint served from its cache; "
                                                            "null: the input price")]
    reasoningEffort: Annotated[str | None, Doc("sent as reasoning_effort: low, medium or high; null: not sent")]
    contextTokens: Annotated[int, Doc("the model's context window in tokens: near it the agent compacts older turns")]
    fromEnvironment: Annotated[list[str], Doc("fields whose value comes from a BOX_MODEL_* variable, not from these settings")]


def context_tokens() -> int:
    """The model's context window: Settings → Model's ``contextTokens``, else the environment's."""
    own = BoxSettings.current().model_context_tokens
    return int(own) if own else int(settings.BOX_MODEL_CONTEXT_TOKENS)


def present_settings() -> ModelSettings:
    row = BoxSettings.current()
    own = {api: getattr(row, column) for api, column in _SETTING_FIELDS.items()}
    shown = {api: (value if value not in (None, "") or (api == "keyName" and value == "") else getattr(settings, _ENV[api]))
             for api, value in own.items()}
    from_env = sorted(api for api, value in own.items() if value is None or (value == "" and api != "keyName"))
    key_name = str(shown["keyName"] or "")
    return {
        "configured": bool(shown["baseUrl"] and shown["model"]),
        "baseUrl": str(shown["baseUrl"] or ""), "model": str(shown["model"] or ""), "keyName": key_name,
        "keySet": bool(key_name) and read_secret(key_name) is not None,
        "keyNeeded": bool(key_name) and not is_loopback(str(shown["baseUrl"] or "")),
        "inputCentsPerMillion": float(shown["inputCentsPerMillion"] or 0),
        "outputCentsPerMillion": float(shown["outputCentsPerMillion"] or 0),
        "cachedInputCentsPerMillion": None if shown["cachedInputCentsPerMillion"] is None else float(shown["cachedInputCentsPerMillion"]),
        "reasoningEffort": str(shown["reasoningEffort"]) if shown["reasoningEffort"] else None,
        "contextTokens": int(shown["contextTokens"]),
        "fromEnvironment": from_env,
    }


def update_settings(body: dict[str, Any]) -> None:
    """Change Settings → Model; the whole body is checked first. ``key`` goes to the vault under
    the key name in force; an empty string clears a field back to its environment value
    (``keyName``: empty means the endpoint takes no key; ``null`` means the environment's)."""
    changes: dict[str, Any] = {}
    for api in ("baseUrl", "model"):
        if api in body:
            value = body[api]
            if not isinstance(value, str) or len(value) > 500:
                raise InvalidRequest(f"'{api}' must be a string of at most 500 characters", field=api)
            value = value.strip()
            if api == "baseUrl" and value:
                parts = urlsplit(value)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise InvalidRequest("'baseUrl' must be an http(s) URL, such as https://api.openai.com/v1", field=api)
            changes[_SETTING_FIELDS[api]] = value
    if "keyName" in body:
        value = body["keyName"]
        if value is not None and value != "":
            value = validate_name(value)
        changes["model_key_name"] = value
    if "reasoningEffort" in body:
        value = body["reasoningEffort"]
        if value is not None and value not in REASONING_EFFORTS:
            raise InvalidRequest("'reasoningEffort' must be low, medium, high or null", field="reasoningEffort")
        changes["model_reasoning_effort"] = value
    if "contextTokens" in body:
        value = body["contextTokens"]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not MIN_CONTEXT_TOKENS <= value <= MAX_CONTEXT_TOKENS):
            raise InvalidRequest(f"'contextTokens' must be a whole number of tokens from {MIN_CONTEXT_TOKENS} to "
                                 f"{MAX_CONTEXT_TOKENS}, or null", field="contextTokens")
        changes["model_context_tokens"] = value
    for api in ("inputCentsPerMillion", "outputCentsPerMillion", "cachedInputCentsPerMillion"):
        if api in body:
            value = body[api]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_PRICE):
                raise InvalidRequest(f"'{api}' must be a number of cents between 0 and {MAX_PRICE:g}", field=api)
            changes[_SETTING_FIELDS[api]] = None if value is None else float(value)
    key = body.get("key")
    if "key" in body and (not isinstance(key, str) or not key):
        raise InvalidRequest("'key' must be a non-empty string", field="key")
    with transaction.atomic():
        row = BoxSettings.objects.select_for_update().get_or_create(pk=1)[0]
        for column, value in changes.items():
            setattr(row, column, value)
        if changes:
            row.save(update_fields=[*changes, "updated_at"])
        if key:
            name = present_settings()["keyName"]
            if not name:
                raise InvalidRequest("set 'keyName' (the vault name for the key) before giving a key", field="key")
            set_secret(name, key)
