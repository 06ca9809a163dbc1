"""MCP tests: the SDK's own client against the real box (``tests.live_box``)."""
from __future__ import annotations

from tests.live_box import LiveBox, live_box

__all__ = ["LiveBox", "live_box"]
