"""Who is asking: the owner in a browser, a program with a token, a paired phone, or the box."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from boxsite.models import ApiToken, Device


@dataclass(frozen=True)
class Principal:
    user: Any
    via: str  # "session", "token", "device", "schedule", "webhook", "system"
    token: Any = None
    device: Any = None

    @property
    def can_use_folders(self) -> bool:
        """Only the owner hands out folders: a session, or a token given that right."""
        if self.via == "session":
            return True
        if self.via == "token":
            return bool(self.token and self.token.can_use_folders)
        return False

    @property
    def can_change_settings(self) -> bool:
        return self.via in ("session", "token")

    @classmethod
    def of(cls, request: Any) -> Principal:
        auth = getattr(request, "auth", None)
        if isinstance(auth, ApiToken):
            return cls(request.user, "token", token=auth)
        if isinstance(auth, Device):
            return cls(request.user, "device", device=auth)
        return cls(request.user, "session")

    @classmethod
    def system(cls, user: Any, via: str = "system") -> Principal:
        return cls(user, via)
