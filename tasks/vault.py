"""The vault: secrets encrypted at rest. (Filled in by the sandbox issue; reading is here.)"""
from __future__ import annotations


def read_secret(name: str) -> str | None:
    from boxsite.models import VaultSecret

    row = VaultSecret.objects.filter(name=name).first()
    if row is None:
        return None
    from tasks.crypto import decrypt

    return decrypt(bytes(row.ciphertext))
