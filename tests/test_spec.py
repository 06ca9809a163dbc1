"""A bad spec is refused whole: a stable code, the field, and nothing left behind."""
from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from boxsite.core.auth import issue_api_token
from boxsite.models import BoxSettings
from tasks.models import Run, Task, TaskEvent

OK_FLOW = {"steps": [{"write": {"path": "a.txt", "content": "a"}}]}

BAD_SPECS = [
    ("unknown field", {"title": "t", "prompt": "p", "budget": 5}, "INVALID_SPEC", "budget"),
    ("no title", {"prompt": "p"}, "INVALID_SPEC", "title"),
    ("empty title", {"title": "  ", "prompt": "p"}, "INVALID_SPEC", "title"),
    ("no prompt and no flow", {"title": "t"}, "INVALID_SPEC", "prompt"),
    ("unknown workspace", {"title": "t", "prompt": "p", "workspace": "nope"}, "INVALID_SPEC", "workspace"),
    ("unknown worker", {"title": "t", "prompt": "p", "worker": "robot"}, "INVALID_SPEC", "worker"),
    ("unknown tool", {"title": "t", "prompt": "p", "tools": ["teleport"]}, "INVALID_SPEC", "tools"),
    ("negative budget", {"title": "t", "prompt": "p", "budgetCents": -1}, "INVALID_SPEC", "budgetCents"),
    ("budget as text", {"title": "t", "prompt": "p", "budgetCents": "5"}, "INVALID_SPEC", "budgetCents"),
    ("bad host", {"title": "t", "prompt": "p", "hosts": ["not a host"]}, "INVALID_SPEC", "hosts"),
    ("relative folder", {"title": "t", "prompt": "p", "folder": "relative/dir"}, "INVALID_SPEC", "folders"),
    ("missing folder", {"title": "t", "prompt": "p", "folder": "/does/not/exist"}, "INVALID_SPEC", "folders"),
    ("command without worker", {"title": "t", "prompt": "p", "command": ["true"]}, "INVALID_SPEC", "command"),
    ("command worker without command", {"title": "t", "prompt": "p", "worker": "command"}, "INVALID_SPEC", "command"),
    ("reserved source", {"title": "t", "prompt": "p", "source": "schedule:x"}, "INVALID_SPEC", "source"),
    ("unknown limit", {"title": "t", "prompt": "p", "limits": {"max_sheep": 3}}, "INVALID_SPEC", "limits.max_sheep"),
    ("unknown constraint", {"title": "t", "prompt": "p", "constraints": {"fly": True}}, "INVALID_SPEC", "constraints.fly"),
    ("payment fill without origins", {"title": "t", "prompt": "p", "constraints": {"payment": "fill_then_approve"}}, "ORIGINS_REQUIRED", "constraints.origins"),
    ("output without a model", {"title": "t", "prompt": "p", "output": {"instructions": "x"}}, "OUTPUT_UNAVAILABLE", "output"),
    ("output schema outside the subset", {"title": "t", "prompt": "p", "output": {"instructions": "x", "schema": {"$ref": "#"}}},
     "INVALID_OUTPUT", "output.schema"),
    ("flow not an object", {"title": "t", "flow": []}, "INVALID_FLOW", "flow"),
    ("flow without steps", {"title": "t", "flow": {"steps": []}}, "INVALID_FLOW", "flow.steps"),
    ("unknown step kind", {"title": "t", "flow": {"steps": [{"teleport": "x"}]}}, "INVALID_FLOW", "flow.steps[0]"),
    ("two step kinds", {"title": "t", "flow": {"steps": [{"run": "ls", "write": {"path": "a", "content": "b"}}]}}, "INVALID_FLOW", "flow.steps[0]"),
    ("stop_before on a reading step", {"title": "t", "flow": {"steps": [{"extract": "rows", "stop_before": "why"}]}}, "INVALID_FLOW", "flow.steps[0].stop_before"),
    ("write without content", {"title": "t", "flow": {"steps": [{"write": {"path": "a"}}]}}, "INVALID_FLOW", "flow.steps[0].write.content"),
    ("wrong type for run", {"title": "t", "flow": {"steps": [{"run": 5}]}}, "INVALID_FLOW", "flow.steps[0]"),
    ("unknown step key", {"title": "t", "flow": {"steps": [{"run": "ls", "retry": 3}]}}, "INVALID_FLOW", "flow.steps[0].retry"),
    ("bad timeout", {"title": "t", "flow": {"steps": [{"run": "ls", "timeout_s": 0}]}}, "INVALID_FLOW", "flow.steps[0].timeout_s"),
    ("write above the task's files", {"title": "t", "flow": {"steps": [{"write": {"path": "a/../../b", "content": "x"}}]}},
     "INVALID_FLOW", "flow.steps[0].write.path"),
    ("write to an absolute path", {"title": "t", "flow": {"steps": [{"write": {"path": "/etc/passwd", "content": "x"}}]}},
     "INVALID_FLOW", "flow.steps[0].write.path"),
    ("write path not a string", {"title": "t", "flow": {"steps": [{"write": {"path": 5, "content": "x"}}]}},
     "INVALID_FLOW", "flow.steps[0].write.path"),
    ("delete above the task's files", {"title": "t", "flow": {"steps": [{"delete": "../x"}]}}, "INVALID_FLOW", "flow.steps[0].delete"),
    ("delete an absolute path", {"title": "t", "flow": {"steps": [{"delete": {"path": "/home"}}]}}, "INVALID_FLOW", "flow.steps[0].delete.path"),
    ("flow worker without flow or prompt", {"title": "t", "worker": "flow"}, "INVALID_SPEC", "prompt"),
]


def _task_dirs() -> set[str]:
    tasks_dir = Path(settings.BOX_DATA_DIR) / "tasks"
    return {p.name for p in tasks_dir.iterdir()} if tasks_dir.is_dir() else set()


def _nothing_created(dirs_before: set[str]) -> None:
    assert Task.objects.count() == 0
    assert TaskEvent.objects.count() == 0
    assert Run.objects.count() == 0
    assert _task_dirs() == dirs_before


@pytest.fixture
def own_data_dir(settings, tmp_path):
    """A data dir of this test's own, so tasks of tests running beside it do not show up."""
    settings.BOX_DATA_DIR = tmp_path / "data"
    settings.BOX_DATA_DIR.mkdir()


@pytest.mark.parametrize(("label", "spec", "code", "field"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_it_rejects_a_bad_spec_and_creates_nothing(box, own_data_dir, label, spec, code, field):
    dirs_before = _task_dirs()
    response = box.api.post("/api/tasks", spec, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == code, body
    assert body["field"] == field, body
    assert body["message"]
    _nothing_created(dirs_before)


def test_it_rejects_a_body_that_is_not_an_object(box):
    response = box.api.post("/api/tasks", [1, 2], format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "INVALID_SPEC"


def test_it_rejects_malformed_json(box):
    response = box.api.post("/api/tasks", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "INVALID_REQUEST"


def test_settings_defaults_apply_only_when_the_spec_names_none(box):
    settings_row = BoxSettings.current()
    settings_row.default_budget_cents = 75
    settings_row.network_default = "allowlist"
    settings_row.default_hosts = ["example.com"]
    settings_row.save()
    defaulted = box.create(title="d", flow=OK_FLOW)
    assert defaulted["budgetCents"] == 75 and defaulted["hosts"] == ["example.com"]
    own = box.create(title="o", flow=OK_FLOW, budgetCents=0, hosts=[])
    assert own["budgetCents"] == 0 and own["hosts"] == []


def test_the_deliberate_defaults_give_no_tools_no_hosts_no_budget(box):
    view = box.create(title="plain", flow=OK_FLOW)
    assert view["tools"] == [] and view["hosts"] == [] and view["budgetCents"] == 0
    assert view["workspace"] == "home" and view["worker"] == "flow" and view["source"] == "api"


def test_a_token_without_the_folder_right_cannot_hand_out_folders(box, tmp_path):
    _, raw = issue_api_token(box.owner, "no-folders", can_use_folders=False)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post("/api/tasks", {"title": "t", "prompt": "p", "folder": str(tmp_path)}, format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "FORBIDDEN"
    assert Task.objects.count() == 0


def test_a_path_inside_the_task_files_or_filled_in_at_run_time_is_taken(box):
    for path in ("sub/../top.txt", "./a/b.txt", "${where}/out.txt"):
        spec = {"title": "t", "flow": {"vars": {"where": "x"}, "steps": [{"write": {"path": path, "content": "x"}}]}}
        response = box.api.post("/api/tasks", spec, format="json")
        assert response.status_code == 201, (path, response.json())
