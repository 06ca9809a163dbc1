"""What a tool is. Below both the registry (``tasks.tools``) and the built-in implementations
(``tasks.tools.builtin``), so neither has to import the other late."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]
    impl: Callable[[Any, dict[str, Any]], Any]
    cost_cents: int = 0
    irreversible: bool = False
    provider: str = "box"  # "box" for built-ins, "owner" for BOX_TOOLS_FILE entries
    extra: dict[str, Any] = field(default_factory=dict)
    # A tool that acts irreversibly only with some arguments (an HTTP request that is not a GET).
    irreversible_when: Callable[[dict[str, Any]], bool] | None = None

    def acts_irreversibly(self, args: dict[str, Any]) -> bool:
        """True when a call with ``args`` needs the owner's OK (unless the task allows destructive steps)."""
        return self.irreversible or (self.irreversible_when is not None and self.irreversible_when(args))
