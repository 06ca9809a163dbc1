"""Tasks can be searched (every word, in the title or the request) beside the state filter."""
from __future__ import annotations

from tests.factories import flow


def test_search_finds_every_word_in_title_or_prompt_and_combines_with_state(box):
    a = box.create(title="Invoice March", prompt="send the invoice to ACME", flow=flow({"run": "true"}))
    b = box.create(title="Backup photos", prompt="copy the photos", flow=flow({"run": "exit 1"}))
    box.wait_state(a["id"], "done")
    box.wait_state(b["id"], "failed")
    titles = lambda **q: [t["title"] for t in box.api.get("/api/tasks", q).json()["results"]]  # noqa: E731
    assert titles(q="invoice") == ["Invoice March"]
    assert titles(q="acme march") == ["Invoice March"]  # both words, one in the prompt
    assert titles(q="photos march") == []
    assert titles(q="PHOTOS", state="failed") == ["Backup photos"]
    assert titles(q="photos", state="done") == []
    too_long = box.api.get("/api/tasks", {"q": "x" * 201})
    assert too_long.status_code == 400 and too_long.json()["field"] == "q"
