"""Settings shows which external agents are installed (stand-in executables on PATH)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client


def test_settings_shows_which_presets_are_installed(box: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "claude"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    client = Client()
    client.force_login(box.owner)
    page = client.get("/settings").content.decode()
    agents = page[page.index('aria-label="External agents"'):]
    claude = agents[agents.index("<strong>claude</strong>"):][:400]
    assert f"installed: <span class=\"mono\">{stand_in}</span>" in claude
    droid = agents[agents.index("<strong>droid</strong>"):][:400]
    assert "not installed" in droid and "npm install -g droid" in droid
