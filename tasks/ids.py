from __future__ import annotations

import secrets
import time

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def base36(number: int) -> str:
    if number == 0:
        return "0"
    out = []
    while number:
        number, rem = divmod(number, 36)
        out.append(_DIGITS[rem])
    return "".join(reversed(out))


def new_task_id() -> str:
    """``tk`` + base-36 milliseconds since the epoch + 4 random hex digits, e.g. ``tkmhx2k1a2f9c``."""
    return f"tk{base36(time.time_ns() // 1_000_000)}{secrets.token_hex(2)}"
