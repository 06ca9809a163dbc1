"""Small helpers for the pause tests: reading approvals, questions and runs through the API."""
from __future__ import annotations

from typing import Any


def approvals_of(box: Any, task_id: str) -> list[dict[str, Any]]:
    return box.task(task_id)["approvals"]


def pending_approval(box: Any, task_id: str) -> dict[str, Any]:
    pending = [a for a in approvals_of(box, task_id) if a["state"] == "pending"]
    assert len(pending) == 1, pending
    return pending[0]


def open_questions(box: Any, task_id: str) -> list[dict[str, Any]]:
    return [q for q in box.task(task_id)["questions"] if q["state"] == "open"]


def post(box: Any, url: str, body: dict[str, Any] | None = None) -> Any:
    return box.api.post(url, body or {}, format="json")


def cont(box: Any, task_id: str, **body: Any) -> Any:
    return post(box, f"/api/tasks/{task_id}/continue", body)


def report(box: Any, task_id: str) -> dict[str, Any]:
    response = box.api.get(f"/api/tasks/{task_id}/report")
    assert response.status_code == 200, response.json()
    return response.json()


def lines(path: Any) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
