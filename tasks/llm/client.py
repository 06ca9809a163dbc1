"""The model: one OpenAI-compatible chat-completions endpoint, configured in one place.

``current_config`` reads Settings → Model (``BoxSettings``) over the ``BOX_MODEL_*`` environment.
``call_model`` is the one way the box asks the model something: messages (and tools, or a JSON
Schema for the answer) in, a ``Decision`` with its ``Usage`` out. Every model-driven part calls
it: the agent worker, ``model`` flow steps, the planner, the rescuer, output shaping, the
browser's grounding. The API key is read from the vault here, in the worker process, and never
enters a task's sandbox.

Callers pass messages that are already redacted (``tasks.vault.facts.Redactor``): this module sends
what it is given.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, TypedDict
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from boxsite.core.errors import InvalidRequest
from boxsite.core.shapes import Doc, Raw
from boxsite.models import BoxSettings
from tasks.vault.store import read_secret, set_secret, validate_name

if TYPE_CHECKING:
    import openai

# A rough count of tokens for the budget's look-ahead: about four characters a token.
CHARS_PER_TOKEN = 4


class NoModel(Exception):
    """No model is configured (no base URL or no model name)."""


class KeyMissing(Exception):
    """The configured model needs a key the vault does not hold."""

    def __init__(self, key_name: str) -> None:
        super().__init__(f"the vault has no {key_name}, the key of the configured model")
        self.key_name = key_name


class ModelError(Exception):
    """The endpoint could not be reached, refused, timed out or answered something unusable."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind  # unreachable, timeout, status, garbage


@dataclass(frozen=True)
class ModelConfig:
    base_url: str
    model: str
    key_name: str  # the vault secret holding the key; "" when the endpoint takes none
    input_cents_per_million: float = 0.0
    output_cents_per_million: float = 0.0
    timeout_s: float = 120.0
    max_output_tokens: int = 2048

    def cost_cents(self, usage: Usage) -> float:
        """What ``usage`` costs, in (fractional) cents."""
        return (usage.input_tokens * self.input_cents_per_million
                + usage.output_tokens * self.output_cents_per_million) / 1_000_000

    def estimate_cents(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """An upper guess of what one call with ``messages`` costs, in whole cents: its input
        counted at four characters a token, and the longest answer it may give."""
        chars = len(json.dumps(messages)) + (len(json.dumps(tools)) if tools else 0)
        guess = Usage(input_tokens=chars // CHARS_PER_TOKEN + 1, output_tokens=self.max_output_tokens)
        return math.ceil(self.cost_cents(guess))

    def shown(self) -> dict[str, Any]:
        return {"baseUrl": self.base_url, "model": self.model, "keyName": self.key_name,
                "inputCentsPerMillion": self.input_cents_per_million,
                "outputCentsPerMillion": self.output_cents_per_million}


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0

    def shown(self) -> dict[str, int]:
        return {"inputTokens": self.input_tokens, "outputTokens": self.output_tokens}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

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

    def message(self) -> dict[str, Any]:
        """The assistant message to append to the conversation."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            out["tool_calls"] = [c.message() for c in self.tool_calls]
        return out

    def shown(self) -> dict[str, Any]:
        return {"content": self.content, "toolCalls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls],
                "finishReason": self.finish_reason, "usage": self.usage.shown(), "latencyMs": self.latency_ms}

    def json_answer(self) -> Any:
        """The content read as JSON (a fenced block is unwrapped); ``ModelError`` when it is not."""
        text = self.content.strip()
        if text.startswith("```"):
            text = text.strip("`")
            text = text.split("\n", 1)[1] if "\n" in text else text
            if text.startswith("json"):
                text = text[4:]
        try:
            return json.loads(text)
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
        timeout_s=float(settings.BOX_MODEL_TIMEOUT_S), max_output_tokens=int(settings.BOX_MODEL_MAX_OUTPUT_TOKENS),
    )


def _price(own: float | None, default: float) -> float:
    return float(own) if own is not None else float(default)


def read_key(config: ModelConfig) -> str:
    """The key to send; ``KeyMissing`` when the config names a vault secret that is not set."""
    if not config.key_name:
        return "none"  # the client insists on one; a keyless local server ignores it
    key = read_secret(config.key_name)
    if key is None:
        raise KeyMissing(config.key_name)
    return key


def call_model(config: ModelConfig, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
               schema: dict[str, Any] | None = None, key: str | None = None, timeout_s: float | None = None) -> Decision:
    """One chat-completions call. ``tools``: function tools the model may call; ``schema``: a
    JSON Schema its answer must follow (asked for as a JSON object; the caller validates it).
    Raises ``ModelError`` (never hangs past the timeout) or ``KeyMissing``."""
    import openai  # noqa: PLC0415 - large in every process that imports it: only where a model is called

    client = _client(config.base_url, key if key is not None else read_key(config))
    kwargs: dict[str, Any] = {"model": config.model, "messages": messages, "max_tokens": config.max_output_tokens,
                              "timeout": timeout_s or config.timeout_s}
    if tools:
        kwargs["tools"] = tools
    if schema is not None:
        kwargs["response_format"] = {"type": "json_object"}
    began = time.monotonic()
    try:
        response = client.chat.completions.create(**kwargs)
    except openai.APITimeoutError as exc:
        raise ModelError(f"the model did not answer within {timeout_s or config.timeout_s:g} s", kind="timeout") from exc
    except openai.APIConnectionError as exc:
        raise ModelError(f"the model's endpoint cannot be reached ({config.base_url}): {exc}", kind="unreachable") from exc
    except openai.APIStatusError as exc:
        raise ModelError(f"the model's endpoint answered HTTP {exc.status_code}: {_error_text(exc)}", kind="status") from exc
    except (openai.APIError, ValueError, TypeError) as exc:
        raise ModelError(f"the model's endpoint answered something that is not a chat completion: {exc}", kind="garbage") from exc
    latency_ms = int((time.monotonic() - began) * 1000)
    return _decision(config, response, latency_ms)


_clients: dict[tuple[str, str], openai.OpenAI] = {}
_clients_lock = threading.Lock()


def _client(base_url: str, key: str) -> openai.OpenAI:
    """One client per endpoint and key, kept for the process: making one builds a TLS context,
    which costs more than a local model's whole answer."""
    import openai  # noqa: PLC0415 - see call_model

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
    return str(exc.message)[:300]


def _decision(config: ModelConfig, response: Any, latency_ms: int) -> Decision:
    try:
        choice = response.choices[0]
        message = choice.message
        calls = []
        for raw in message.tool_calls or []:
            try:
                arguments = json.loads(raw.function.arguments or "{}")
            except ValueError as exc:
                raise ModelError(f"the model called {raw.function.name} with arguments that are not JSON", kind="garbage") from exc
            if not isinstance(arguments, dict):
                raise ModelError(f"the model called {raw.function.name} with arguments that are not an object", kind="garbage")
            calls.append(ToolCall(id=str(raw.id), name=str(raw.function.name), arguments=arguments))
        usage = Usage(input_tokens=int(getattr(response.usage, "prompt_tokens", 0) or 0),
                      output_tokens=int(getattr(response.usage, "completion_tokens", 0) or 0))
    except (AttributeError, IndexError, TypeError) as exc:
        raise ModelError(f"the model's endpoint answered something that is not a chat completion: {exc}", kind="garbage") from exc
    return Decision(content=str(message.content or ""), tool_calls=calls, usage=usage, cost_cents=config.cost_cents(usage),
                    finish_reason=str(choice.finish_reason or ""), latency_ms=latency_ms)


class ModelTest(TypedDict):
    ok: bool
    answer: NotRequired[str]
    error: NotRequired[str]
    kind: NotRequired[Annotated[str, Raw({"type": "string", "description": "what went wrong",
                                          "enum": ["key", "unreachable", "timeout", "status", "garbage", "config"]})]]
    usage: NotRequired[dict[str, Any]]
    latencyMs: NotRequired[int]
    costCents: NotRequired[float]


def check_connection(config: ModelConfig) -> ModelTest:
    """Settings → Model's "Test connection": one short call; what the endpoint answered."""
    try:
        decision = call_model(config, [{"role": "user", "content": "Reply with the single word: ready"}],
                              timeout_s=min(config.timeout_s, 30.0))
    except KeyMissing as exc:
        return {"ok": False, "error": str(exc), "kind": "key"}
    except ModelError as exc:
        return {"ok": False, "error": exc.message, "kind": exc.kind}
    return {"ok": True, "answer": decision.content[:500], "usage": decision.usage.shown(), "latencyMs": decision.latency_ms,
            "costCents": round(decision.cost_cents, 4)}


# --- Settings → Model ------------------------------------------------------------------------
_SETTING_FIELDS = {"baseUrl": "model_base_url", "model": "model_name", "keyName": "model_key_name",
                   "inputCentsPerMillion": "model_input_cents_per_million",
                   "outputCentsPerMillion": "model_output_cents_per_million"}
_ENV = {"baseUrl": "BOX_MODEL_BASE_URL", "model": "BOX_MODEL_NAME", "keyName": "BOX_MODEL_KEY_NAME",
        "inputCentsPerMillion": "BOX_MODEL_INPUT_CENTS_PER_MILLION", "outputCentsPerMillion": "BOX_MODEL_OUTPUT_CENTS_PER_MILLION"}
MAX_PRICE = 1_000_000.0  # cents per million tokens ($10,000): anything above is a typo


class ModelSettings(TypedDict):
    configured: Annotated[bool, Doc("a base URL and a model name are set (here or in the environment)")]
    baseUrl: str
    model: str
    keyName: Annotated[str, Doc("the vault secret holding the API key; empty: the endpoint takes none")]
    keySet: Annotated[bool, Doc("the vault holds keyName")]
    inputCentsPerMillion: float
    outputCentsPerMillion: float
    fromEnvironment: Annotated[list[str], Doc("fields whose value comes from a BOX_MODEL_* variable, not from these settings")]


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
        "inputCentsPerMillion": float(shown["inputCentsPerMillion"] or 0),
        "outputCentsPerMillion": float(shown["outputCentsPerMillion"] or 0),
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
    for api in ("inputCentsPerMillion", "outputCentsPerMillion"):
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
