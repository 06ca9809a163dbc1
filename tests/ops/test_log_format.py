"""BOX_LOG_FORMAT=json: every log line the box writes is one JSON object."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.cluster import MANAGE
from tests.conftest import database_env

LOGS = ("import logging; log = logging.getLogger('box.ops')\n"
        "log.warning('disk %s is %d%% full', '/data', 91)\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    log.exception('the sum failed')\n")


def _shell(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, MANAGE, "shell", "-c", LOGS], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(MANAGE).parent)


def test_with_json_each_log_line_is_an_object_with_its_message_and_traceback(transactional_db: Any) -> None:
    done = _shell({**database_env(), "BOX_LOG_FORMAT": "json"})
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line["logger"] == "box.ops"]
    assert [line["message"] for line in ours] == ["disk /data is 91% full", "the sum failed"]
    assert ours[0]["level"] == "WARNING" and ours[0]["time"].endswith("+00:00") and "exception" not in ours[0]
    assert ours[1]["level"] == "ERROR" and "ZeroDivisionError" in ours[1]["exception"]


def test_by_default_lines_stay_plain_and_an_unknown_format_is_refused(transactional_db: Any) -> None:
    plain = _shell(database_env())
    assert "WARNING box.ops: disk /data is 91% full" in plain.stderr
    refused = subprocess.run([sys.executable, MANAGE, "doctor"], env={**database_env(), "BOX_LOG_FORMAT": "xml"},
                             capture_output=True, text=True, timeout=120, cwd=Path(MANAGE).parent)
    assert refused.returncode != 0 and "BOX_LOG_FORMAT must be plain or json" in refused.stderr
