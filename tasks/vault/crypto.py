"""Encryption at rest for the vault (Fernet, with MultiFernet for key rotation).

Keys come from ``BOX_SECRET_KEY`` (or the file named by ``BOX_SECRET_KEY_FILE``): one or more
Fernet keys separated by commas or newlines; the first encrypts, every one of them decrypts.
Without either, a key is generated once into ``BOX_DATA_DIR/vault.key`` (mode 0600).

Rotating: put a new key first (``BOX_SECRET_KEY=new,old``, or ``rotatevaultkey --generate``
for the generated key file), run ``manage.py rotatevaultkey`` to re-encrypt every row under it,
then drop the old key (``rotatevaultkey --retire``). Between those steps both keys decrypt.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from boxsite.core.env import env_str
from boxsite.core.keyfiles import create_once

log = logging.getLogger(__name__)

_SEPARATORS = re.compile(r"[,\s]+")


class VaultKeyError(ImproperlyConfigured):
    pass


def key_file() -> Path:
    return Path(settings.BOX_DATA_DIR) / "vault.key"


def keys_are_configured() -> bool:
    """True when keys come from the environment, not from the generated key file."""
    return bool(env_str("BOX_SECRET_KEY"))


def _split(raw: str) -> list[bytes]:
    return [part.encode() for part in _SEPARATORS.split(raw.strip()) if part]


def _write_beside(path: Path, key_lines: list[bytes]) -> Path:
    """Write ``key_lines`` to a private (0600) file beside ``path`` and return it. The caller links or
    renames it into place, so a reader never sees a half-written key file."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(b"\n".join(key_lines) + b"\n")
    return partial


def _generate_key_file(path: Path) -> None:
    """Write a fresh key, atomically: a concurrent reader never sees an empty file, and of two
    processes generating at once the first one's key is kept."""
    if create_once(path, Fernet.generate_key() + b"\n"):
        log.info("generated a new vault key in %s", path)


def keys() -> list[bytes]:
    """The vault keys, newest (encrypting) first."""
    configured = env_str("BOX_SECRET_KEY")
    if configured:
        found = _split(configured)
    else:
        path = key_file()
        if not path.exists():
            _generate_key_file(path)
        found = _split(path.read_text())
    if not found:
        raise VaultKeyError("the vault key is empty: set BOX_SECRET_KEY or remove the empty key file")
    return found


def fernet() -> MultiFernet:
    try:
        return MultiFernet([Fernet(k) for k in keys()])
    except ValueError as exc:
        raise VaultKeyError(f"a vault key is not a valid Fernet key (32 url-safe base64 bytes): {exc}") from exc


def encrypt(value: str) -> bytes:
    return fernet().encrypt(value.encode())


def decrypt(token: bytes) -> str:
    try:
        return fernet().decrypt(token).decode()
    except InvalidToken as exc:
        raise VaultKeyError("a vault secret cannot be decrypted with any configured key (was a key dropped too early?)") from exc


def reencrypt(token: bytes) -> bytes:
    """The same secret encrypted under the first key (decrypts with any configured key)."""
    try:
        return fernet().rotate(token)
    except InvalidToken as exc:
        raise VaultKeyError("a vault secret cannot be decrypted with any configured key") from exc


def encrypted_with_first_key(token: bytes) -> bool:
    try:
        Fernet(keys()[0]).decrypt(token)
    except InvalidToken:
        return False
    return True


def prepend_generated_key() -> None:
    """Put a fresh key in front of the generated key file (the old ones still decrypt)."""
    if keys_are_configured():
        raise VaultKeyError("the vault keys come from BOX_SECRET_KEY: put the new key first there instead")
    path = key_file()
    os.replace(_write_beside(path, [Fernet.generate_key(), *keys()]), path)


def retire_old_generated_keys() -> int:
    """Keep only the first key in the generated key file; returns how many keys were dropped."""
    if keys_are_configured():
        raise VaultKeyError("the vault keys come from BOX_SECRET_KEY: remove the old key there instead")
    current = keys()
    path = key_file()
    os.replace(_write_beside(path, current[:1]), path)
    return len(current) - 1
