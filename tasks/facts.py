"""Facts and secrets: which values are secret, and the one redaction function.

Everything the box stores or shows (events, API responses, WebSocket frames, errors, reports,
prompts sent to a model) passes through ``Redactor.redact``. Secret values, their base64 forms
and each line of a multi-line value become ``${name}``; any Luhn-valid card-like number becomes
``${card}``.
"""
from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Names that always mean "secret". Matched on the name folded to lowercase words.
SENSITIVE_TERMS = (
    "card number", "card no", "cardnumber", "card", "cvv", "cvc", "csc", "otp", "one time code",
    "password", "passwd", "passcode", "pin", "passport", "aadhaar", "pan", "iban", "ssn",
    "social security", "api key", "apikey", "secret", "token", "private key", "access key",
    "credential", "auth",
)

_CARD_RUN = re.compile(r"(?<![\d])(?:\d[ -]?){12,18}\d(?![\d])")
_NAME_RE = re.compile(r"\$\{([^}]+)\}")
_MIN_SECRET_LEN = 3  # shorter values would mask ordinary text


def _words(name: str) -> str:
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)
    return " " + re.sub(r"[^a-z0-9]+", " ", spaced.lower()).strip() + " "


def is_sensitive_name(name: str) -> bool:
    words = _words(name)
    return any(f" {term} " in words or (" " in term and term in words) for term in SENSITIVE_TERMS)


def luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def looks_like_card(value: str) -> bool:
    for match in _CARD_RUN.finditer(value):
        digits = re.sub(r"\D", "", match.group())
        if 13 <= len(digits) <= 19 and luhn_valid(digits):
            return True
    return False


def mask_cards(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        digits = re.sub(r"\D", "", match.group())
        if 13 <= len(digits) <= 19 and luhn_valid(digits):
            return "${card}"
        return match.group()

    return _CARD_RUN.sub(replace, text)


def names_in(text: str) -> list[str]:
    return _NAME_RE.findall(text)


def guess_kind(name: str) -> str:
    words = _words(name)
    if "email" in words or "e mail" in words:
        return "email"
    if " phone " in words or " mobile " in words or "phone" in words:
        return "phone"
    if " date " in words or " birth " in words or " dob " in words or "date" in words:
        return "date"
    if " count " in words or " number of " in words or " travellers " in words or " amount " in words:
        return "number"
    return "text"


def _secret_forms(value: str) -> list[str]:
    forms = {value}
    for line in value.splitlines():
        if len(line.strip()) >= _MIN_SECRET_LEN:
            forms.add(line.strip())
    raw = value.encode()
    for encoder in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encoder(raw).decode()
        forms.add(encoded)
        forms.add(encoded.rstrip("="))
    return sorted((f for f in forms if len(f) >= _MIN_SECRET_LEN), key=len, reverse=True)


@dataclass
class Redactor:
    """Masks a fixed set of secret values. Build one per task with ``Facts.redactor()``."""

    secrets: Mapping[str, str] = field(default_factory=dict)
    _pairs: list[tuple[str, str]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        pairs = []
        for name, value in self.secrets.items():
            for form in _secret_forms(str(value)):
                pairs.append((form, "${" + name + "}"))
        self._pairs = sorted(pairs, key=lambda p: len(p[0]), reverse=True)

    def text(self, text: str) -> str:
        for secret, placeholder in self._pairs:
            if secret in text:
                text = text.replace(secret, placeholder)
        return mask_cards(text)

    def redact(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(k)): self.redact(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redact(v) for v in value]
        return value


def redact_text(text: str) -> str:
    """Redaction without a task's secrets: card-like numbers only."""
    return mask_cards(text)


@dataclass
class Facts:
    values: dict[str, Any]
    secret_names: frozenset[str]

    @classmethod
    def build(cls, values: Mapping[str, Any], declared_secret: Iterable[str] = ()) -> Facts:
        secret = set(declared_secret)
        for name, value in values.items():
            if is_sensitive_name(name) or looks_like_card(str(value)):
                secret.add(name)
        return cls(dict(values), frozenset(secret))

    @classmethod
    def of(cls, task: Any) -> Facts:
        return cls.build(task.facts or {}, task.secret_facts or [])

    def shared(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if k not in self.secret_names}

    def secrets(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.values.items() if k in self.secret_names and v not in (None, "")}

    def redactor(self) -> Redactor:
        return Redactor(self.secrets())


def redactor_for(task: Any) -> Redactor:
    return Facts.of(task).redactor()
