"""Facts and secrets: which values are secret, and the one redaction function.

Everything the box stores or shows (events, API responses, WebSocket frames, errors, reports,
prompts sent to a model) passes through ``Redactor.redact``. Secret values, their base64 forms
and each line of a multi-line value become ``${name}``; an undeclared number becomes ``${card}``
only when it looks like a card (see ``looks_like_card``), so ordinary numbers stay as they are.

A task's redactor masks its secret facts and every value in the vault: a preset's key, a
command tool's keys and model keys are handed to a run at different moments (some only after a
``box ask``), and none of them may reach the log in clear, so all of them are in every redactor.

Secret values are sealed (Fernet) inside ``Task.facts`` so a copy of the database does not hold
them in clear; ``Facts.of(task)`` is the one reader that opens them (docs/internals/decisions.md).
"""
from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from boxsite.core import reads
from boxsite.core.cards import looks_like_card, mask_cards
from tasks import sql
from tasks.models import VaultSecret
from tasks.vault import crypto
from tasks.vault.crypto import decrypt, encrypt, encrypted_with_first_key, reencrypt

# Names that always mean "secret", as whole words of the name (``cardNumber`` -> "card number").
SENSITIVE_WORDS = frozenset({
    "card", "cvv", "cvc", "csc", "cvn", "otp", "totp", "pin", "passport", "aadhaar", "aadhar", "pan",
    "iban", "ssn", "password", "passwd", "pwd", "passcode", "passphrase", "secret", "token", "key",
    "apikey", "credential", "credentials", "auth", "bearer", "cookie", "session", "signature",
    "mfa", "2fa", "sin", "nin", "tin", "bsn", "routing", "swift",
})
# Phrases matched anywhere in the folded name.
SENSITIVE_PHRASES = (
    "card number", "card no", "one time", "security code", "verification code", "account number",
    "social security", "private key", "access key", "api key", "client secret", "sort code",
    "tax id", "national id", "date of expiry", "expiry date",
)
# Fragments matched inside a single word too (``mypassword``, ``githubtoken``, ``apikeys``).
SENSITIVE_FRAGMENTS = ("password", "passwd", "passcode", "passport", "secret", "token", "apikey",
                       "privatekey", "cardnumber", "credential", "aadhaar", "cvv")

_NAME_RE = re.compile(r"\$\{([^}]+)\}")
_MIN_SECRET_LEN = 3  # shorter values would mask ordinary text
_MIN_ENCODED_LEN = 8  # a shorter slice of an encoding matches too much ordinary text
_SEALED = "$sealed"

log = logging.getLogger(__name__)


def _words(name: str) -> str:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return " " + re.sub(r"[^a-z0-9]+", " ", spaced.lower()).strip() + " "


def is_sensitive_name(name: str) -> bool:
    """True when a fact's name says it is secret, whatever the caller asked for."""
    words = _words(name)
    parts = words.split()
    if any(w in SENSITIVE_WORDS or (w.endswith("s") and w[:-1] in SENSITIVE_WORDS) for w in parts):
        return True
    if any(phrase in words for phrase in SENSITIVE_PHRASES):
        return True
    squashed = "".join(parts)
    return any(fragment in squashed for fragment in SENSITIVE_FRAGMENTS)


def names_in(text: str) -> list[str]:
    return _NAME_RE.findall(text)


def guess_kind(name: str) -> str:
    """The input kind a field probably wants, from its name: email, phone, date, number, text."""
    words = _words(name)
    squashed = words.replace(" ", "")
    if "email" in squashed or " e mail " in words:
        return "email"
    if "phone" in squashed or "mobile" in squashed:
        return "phone"
    if any(f" {w} " in words for w in ("date", "birth", "dob", "birthday")) or "date" in squashed:
        return "date"
    if any(f" {w} " in words for w in ("count", "travellers", "travelers", "quantity", "amount", "age")) \
            or " number of " in words or words.startswith(" num "):
        return "number"
    return "text"


def _encoded_cores(raw: bytes) -> set[str]:
    """The part of ``raw``'s base64 that is the same wherever ``raw`` sits in a longer input.

    Base64 works in 3-byte groups, so the same bytes encode differently at each of the three
    offsets; for each offset keep only the characters that depend on ``raw`` alone.
    """
    cores: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        start = (0, 2, 3)[offset]
        total = offset + len(raw)
        end = (total // 3) * 4 + (0, 1, 2)[total % 3]
        core = encoded[start:end]
        if len(core) >= _MIN_ENCODED_LEN:
            cores.add(core)
            cores.add(core.replace("+", "-").replace("/", "_"))  # the URL-safe alphabet
    return cores


def _secret_forms(value: str) -> set[str]:
    """Every form of a secret value worth masking: itself, its lines, its encodings."""
    plain = {value, value.strip()}
    if looks_like_card(value):  # a card given as "4111 1111 ..." also shows as plain digits
        digits = re.sub(r"\D", "", value)
        plain.add(digits)
        plain.add(" ".join(digits[i:i + 4] for i in range(0, len(digits), 4)))
        plain.add("-".join(digits[i:i + 4] for i in range(0, len(digits), 4)))
    forms = set(plain)
    lines = [line.strip() for line in value.splitlines() if line.strip()]
    if len(lines) > 1:
        forms.update(lines)
    forms.add(json.dumps(value)[1:-1])  # as it appears inside JSON text
    forms.add(quote(value, safe=""))
    for text in plain:
        for raw in (text.encode(), (text + "\n").encode()):
            forms.update(_encoded_cores(raw))
            full = base64.b64encode(raw).decode()
            forms.add(full)
            # `base64` and PEM wrap their output; each wrapped line is a slice of the whole.
            for width in (76, 64):
                forms.update(full[i:i + width] for i in range(0, len(full), width))
    return {f for f in forms if len(f) >= _MIN_SECRET_LEN}


@dataclass
class Redactor:
    """Masks a fixed set of secret values. Build one per task with ``Facts.redactor()``.

    One pass of one pattern (longest form first) so a placeholder already written is never
    matched again, even when a secret is a piece of another secret's name.
    """

    secrets: Mapping[str, str] = field(default_factory=dict)
    vault_stamp: tuple[Any, ...] | None = None  # the vault it was built with (``refreshed``)
    _pattern: re.Pattern[str] | None = field(init=False, default=None)
    _names: dict[str, str] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        names: dict[str, str] = {}
        for name, value in sorted(self.secrets.items()):
            for form in _secret_forms(str(value)):
                names.setdefault(form, name)
        self._names = names
        if names:
            ordered = sorted(names, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(f) for f in ordered))

    def text(self, text: str) -> str:
        if self._pattern is not None:
            text = self._pattern.sub(lambda m: "${" + self._names[m.group()] + "}", text)
        return mask_cards(text)

    def redact(self, value: Any) -> Any:
        """``value`` with every string in it masked, timestamps too: a task can write a string
        shaped as a time, and a short secret (a PIN, a year) inside one would otherwise leave
        the log unmasked. A timestamp a short secret happens to collide with shows its
        placeholder."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(k)): self.redact(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redact(v) for v in value]
        return value


VAULT_READ = "vault"  # its name in a ``boxsite.core.reads`` scope
# The vault's values as last read, under the stamp they were read at (see vault_values).
_vault_cache: tuple[tuple[Any, ...], dict[str, str]] = ((), {})
# Redactors built lately, by (vault stamp, the task's own secrets): a run asks for its task's
# redactor at its start, its finish and for each blocker it opens; each build compiles one
# pattern from every form of every secret, so the same set of secrets is compiled once.
_redactors: dict[tuple[Any, ...], Redactor] = {}
_REDACTORS_KEPT = 64
_redactors_lock = threading.Lock()


def vault_values() -> dict[str, str]:
    """Every secret in the vault, by name: what a run may be given (preset, tool and model
    keys). Read again only when the vault changed; one small query says whether it did, once
    per request (``boxsite.core.reads``; a vault write in it drops what was read)."""
    return _vault()[1]


def _vault() -> tuple[tuple[Any, ...], dict[str, str]]:
    """The vault's stamp and values (``vault_values``)."""
    return reads.held(VAULT_READ, _vault_now)


def _vault_now() -> tuple[tuple[Any, ...], dict[str, str]]:
    global _vault_cache
    key = sql.vault_stamp()  # only compared with the last one
    cached_key, values = _vault_cache
    if cached_key != key:
        values = {row.name: crypto.decrypt(bytes(row.ciphertext)) for row in VaultSecret.objects.all()}
        _vault_cache = (key, values)
    return key, values


def redactor_of(own: Mapping[str, str]) -> Redactor:
    """A redactor for ``own`` secrets and every vault value, as the vault stands now."""
    stamp, vault = _vault()
    return _redactor(stamp, {**vault, **own})


def refreshed(redactor: Redactor) -> Redactor:
    """``redactor`` with every vault value as the vault stands now: a secret added to the vault
    since it was built is masked too. The same redactor when the vault has not changed."""
    stamp, vault = _vault()
    if redactor.vault_stamp == stamp:
        return redactor
    return _redactor(stamp, {**redactor.secrets, **vault})


def _redactor(stamp: tuple[Any, ...], secrets: dict[str, str]) -> Redactor:
    key = (stamp, tuple(sorted(secrets.items())))
    redactor = _redactors.get(key)
    if redactor is None:
        redactor = Redactor(secrets, vault_stamp=stamp)
        with _redactors_lock:
            if len(_redactors) >= _REDACTORS_KEPT:
                _redactors.pop(next(iter(_redactors)))
            _redactors[key] = redactor
    return redactor


def _is_sealed(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {_SEALED}


def _open(value: Any) -> str:
    return decrypt(value[_SEALED].encode())


def resealed(values: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """``values`` with every sealed secret re-encrypted under the vault's first key, and how many
    were (vault key rotation: ``tasks.vault.store.rotate``)."""

    out: dict[str, Any] = {}
    count = 0
    for name, value in values.items():
        if _is_sealed(value):
            value = {_SEALED: reencrypt(value[_SEALED].encode()).decode()}
            count += 1
        out[name] = value
    return out, count


def sealed_on_old_keys(values: Mapping[str, Any]) -> bool:
    """True when a sealed secret in ``values`` is not yet under the vault's first key."""

    return any(_is_sealed(v) and not encrypted_with_first_key(v[_SEALED].encode()) for v in values.values())


@dataclass
class Facts:
    values: dict[str, Any]
    secret_names: frozenset[str]

    @classmethod
    def build(cls, values: Mapping[str, Any], declared_secret: Iterable[str] = ()) -> Facts:
        """Decide which facts are secret: a sensitive name, a card-like value, or declared.

        Declaring can only add secrets; nothing makes a sensitive name shared.
        """
        secret = set(declared_secret)
        opened: dict[str, Any] = {}
        for name, value in values.items():
            if _is_sealed(value):
                value = _open(value)
                secret.add(name)  # it was secret when sealed; it stays secret
            opened[name] = value
            if is_sensitive_name(name) or looks_like_card(str(value)):
                secret.add(name)
        return cls(opened, frozenset(secret))

    @classmethod
    def of(cls, task: Any) -> Facts:
        return cls.build(task.facts or {}, task.secret_facts or [])

    def with_vault(self, names: Iterable[str]) -> Facts:
        """These facts and the vault secrets ``names`` (those the vault holds), all secret: a run's
        values for ``${NAME}``. Only a run holds them; nothing stores them in the task."""
        wanted = [n for n in names if n not in self.values]
        if not wanted:
            return self  # most tasks list none: the vault is not read
        vault = vault_values()
        given = {n: vault[n] for n in wanted if n in vault}
        if not given:
            return self
        return Facts({**self.values, **given}, self.secret_names | frozenset(given))

    def merged(self, inputs: Mapping[str, Any], declared_secret: Iterable[str] = ()) -> Facts:
        """These facts with ``inputs`` merged in, every name checked again."""
        return Facts.build({**self.values, **inputs}, set(self.secret_names) | set(declared_secret))

    def shared(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if k not in self.secret_names}

    def secrets(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.values.items() if k in self.secret_names and v not in (None, "")}

    def sealed(self) -> dict[str, Any]:
        """The form ``Task.facts`` stores: shared values as given, secret values encrypted."""

        return {
            name: ({_SEALED: encrypt(str(value)).decode()} if name in self.secret_names and value not in (None, "") else value)
            for name, value in self.values.items()
        }

    def shown(self) -> dict[str, Any]:
        """How facts look to callers: a secret is its ``${name}``."""
        return {name: ("${" + name + "}" if name in self.secret_names else value) for name, value in self.values.items()}

    def redactor(self) -> Redactor:
        """The run's redactor: these facts' secrets and every vault value (the module docstring)."""
        return redactor_of(self.secrets())


def seal_facts(values: Mapping[str, Any], declared_secret: Iterable[str] = ()) -> dict[str, Any]:
    """What to store in ``Task.facts`` for ``values``: secrets sealed, the rest as given."""
    return Facts.build(values, declared_secret).sealed()


# --- saved values -----------------------------------------------------------------------------
# What a step saved (``save``) is data for the steps after it: ``Task.records`` keeps the real
# value. A value the task's redactor would change (it holds a secret, or a number that looks like
# a card) is sealed like a secret fact; display (the report, the log, the diff) redacts on the
# way out, never in the store.

def seal_records(records: Mapping[str, Any], redactor: Redactor) -> dict[str, Any]:
    """What ``Task.records`` stores for ``records``: a value with something secret in it sealed
    (as JSON), the rest as saved."""
    return {name: ({_SEALED: encrypt(json.dumps(value)).decode()} if redactor.redact(value) != value else value)
            for name, value in records.items()}


def open_records(records: Mapping[str, Any], facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The real saved values (for the steps that use them; shown only through a redactor).
    ``facts``: a value saved before records were sealed holds ``${name}`` placeholders for the
    secrets in it; they are filled from the task's facts."""
    out: dict[str, Any] = {}
    for name, value in records.items():
        if _is_sealed(value):
            out[name] = json.loads(_open(value))
        else:
            out[name] = _fill(value, facts) if facts else value
    return out


_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _fill(value: Any, facts: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: str(facts[m.group(1)]) if m.group(1) in facts else m.group(), value)
    if isinstance(value, list):
        return [_fill(v, facts) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, facts) for k, v in value.items()}
    return value


def redactor_for(task: Any) -> Redactor:
    return Facts.of(task).redactor()
