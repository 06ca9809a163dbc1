"""Encryption at rest for the vault and secret facts (Fernet with MultiFernet for rotation)."""
from __future__ import annotations

import os
from pathlib import Path

from cryptography.fernet import Fernet, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from boxsite.env import env_str


def _keys() -> list[bytes]:
    configured = env_str("BOX_SECRET_KEY")
    if configured:
        return [k.strip().encode() for k in configured.split(",") if k.strip()]
    key_file = Path(settings.BOX_DATA_DIR) / "vault.key"
    if not key_file.exists():
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(Fernet.generate_key())
    return [k.strip() for k in key_file.read_bytes().splitlines() if k.strip()]


def fernet() -> MultiFernet:
    try:
        return MultiFernet([Fernet(k) for k in _keys()])
    except ValueError as exc:
        raise ImproperlyConfigured(f"the vault key is not a valid Fernet key: {exc}") from exc


def encrypt(value: str) -> bytes:
    return fernet().encrypt(value.encode())


def decrypt(token: bytes) -> str:
    return fernet().decrypt(token).decode()
