"""An external agent's HOME in the sandbox: its own, outside the task's copy, gone at release."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.sandbox import paths
from tests.sandbox.conftest import needs_sandbox


@needs_sandbox
def test_a_presets_home_is_the_task_users_own_and_its_dotfiles_never_reach_the_diff(sandboxed: Any, tmp_path: Path,
                                                                                   settings: Any) -> None:
    script = sandboxed.home / "cli.sh"
    script.write_text(
        "#!/bin/sh\n"
        'mkdir -p "$HOME/.cli" && echo session > "$HOME/.cli/session.json" || exit 7\n'
        "echo made > made.txt\n"
        'echo "home: $HOME owner: $(stat -c %u "$HOME") me: $(id -u)"\n'
    )
    script.chmod(0o755)
    presets = tmp_path / "presets.json"
    presets.write_text(json.dumps([{"name": "cli", "argv": ["/bin/sh", "cli.sh", "{prompt}"], "hosts": []}]))
    settings.BOX_PRESETS_FILE = str(presets)
    task = sandboxed.create(title="dotfiles", worker="cli", prompt="go")
    view = sandboxed.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert sandboxed.api.get(f"/api/tasks/{task['id']}/diff").json()["added"] == ["made.txt"]
    [line] = [e["summary"] for e in sandboxed.events(task["id"]) if e["kind"] == "output"]
    home, owner, me = line.split()[1], line.split()[3], line.split()[5]
    assert home == str(paths.private_home(task["id"])) and owner == me != "0"
