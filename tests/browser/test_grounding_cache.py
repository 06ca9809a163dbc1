"""The grounding cache never clicks the wrong thing: a remembered element is replayed only while
it is still the element the model chose (a list whose order or prices changed is not clicked at
the old position), an instruction that depends on the page's data asks the model every time,
a failed action keeps nothing, an entry expires, stays in its owner's workspace, and the owner
alone lists and clears entries (API and Settings)."""
from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from tasks.browser.cache import remember
from tasks.models import GroundingEntry, Task, Workspace
from tests.browser.sites_cache import Flights, serve_flights
from tests.factories import flow, make_owner
from tests.fakemodel import (
    Answer,
    fake_model,  # noqa: F401 - fixture
    say,
)
from tests.model.conftest import model  # noqa: F401 - fixture
from tests.portal.conftest import pair_device
from tests.portal.test_account_api import phone_client

PLAY = "the Play flight's Select button"
CHEAPEST = "the cheapest flight's Select button"


@pytest.fixture
def flights(chromium: None) -> Iterator[Flights]:
    with serve_flights() as running:
        yield running


def offers_in(body: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(ref, flight, price) of each Select button in the elements the box sent the model to
    find one; none in any other request (a failed step's rescue)."""
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    found = re.findall(r'\[(\d+)\] button "Select" — in: (\w+ [\d:]+) ₹([\d,]+)', prompt)
    return [(ref, name, int(price.replace(",", ""))) for ref, name, price in found]


def pick_play(body: dict[str, Any]) -> Answer:
    refs = [ref for ref, name, _ in offers_in(body) if name.startswith("Play")]
    return say(f'{{"ref": {refs[0]}, "why": "the Play flight"}}' if refs else "no idea")


def pick_cheapest(body: dict[str, Any]) -> Answer:
    return say(f'{{"ref": {min(offers_in(body), key=lambda offer: offer[2])[0]}, "why": "lowest fare"}}')


def asked_to_find(model: Any) -> int:  # noqa: F811
    """How many times the box asked the model to find an element."""
    return sum(1 for r in model.received if any(str(m.get("content", "")).startswith("Step: ") for m in r.messages))


def run(box: Any, site: Flights, instruction: str, *, page: str = "/flights", kind: str = "click",
        state: str = "done", **spec: Any) -> dict[str, Any]:
    target: dict[str, Any] = {"describe": instruction, **({"value": "x"} if kind == "fill" else {})}
    steps = flow({"browse": f"{site.url}{page}"}, {kind: target, "timeout_s": 5}, {"extract": "h1", "save": "heading"})
    task = box.create(title="cached", hosts=["127.0.0.1"], budgetCents=100, flow=steps, **spec)
    view = box.wait_state(task["id"], "done", "failed", "waiting", timeout=90)
    assert view["state"] == state, (view, [e["summary"] for e in box.events(task["id"])])
    return task


def grounding_of(box: Any, task_id: str) -> dict[str, Any]:
    [acted] = [e for e in box.events(task_id) if e["kind"] == "step_result" and e["data"]["kind"] in ("click", "fill")]
    return acted["data"]["grounding"]


def chosen(box: Any, task_id: str) -> str:
    return box.api.get(f"/api/tasks/{task_id}/report").json()["records"]["heading"][0]["value"]


def entries(box: Any, **query: str) -> list[dict[str, Any]]:
    response = box.api.get("/api/browser/cache", query)
    assert response.status_code == 200, response.json()
    return response.json()["results"]


@pytest.mark.parametrize("page", ["/flights", "/cards"])
def test_a_list_whose_order_changed_is_not_clicked_at_the_old_position(sandboxed, flights, model, page):  # noqa: F811
    model.fallback = pick_play
    first = run(sandboxed, flights, PLAY, page=page)
    assert chosen(sandboxed, first["id"]) == "You chose Play 09:10" and len(model.received) == 1
    [entry] = entries(sandboxed)
    assert entry["instruction"] == PLAY and entry["origin"] == flights.url and entry["path"] == page
    assert entry["fingerprint"]["role"] == "button" and entry["fingerprint"]["name"] == "Select"
    assert "Play 09:10" in entry["fingerprint"]["row"]

    flights.offers.reverse()  # Sky, Play, Air: the second button is still in second place...
    flights.offers.insert(0, flights.offers.pop())  # ...Air, Sky, Play: now it is Sky's
    second = run(sandboxed, flights, PLAY, page=page)
    assert chosen(sandboxed, second["id"]) == "You chose Play 09:10"
    how = grounding_of(sandboxed, second["id"])
    if page == "/flights":  # the row names it: the replay finds Play's button where it is now
        assert how["from"] == "cache" and len(model.received) == 1
        assert "nth-of-type" not in how["selector"]
    else:  # only a CSS path tells the boxes apart: it finds Sky's button, which is not the one kept
        assert how["from"] == "model" and len(model.received) == 2
        assert "Sky 12:30" in how["checked"][0]["why"] and "Play 09:10" in how["checked"][0]["why"]

    flights.offers[:] = [(name, 3999 if name.startswith("Play") else price) for name, price in flights.offers]
    third = run(sandboxed, flights, PLAY, page=page)  # the row says something else now: asked again
    assert chosen(sandboxed, third["id"]) == "You chose Play 09:10"
    assert grounding_of(sandboxed, third["id"])["from"] == "model"


def test_an_instruction_that_depends_on_the_pages_data_asks_the_model_every_time(sandboxed, flights, model):  # noqa: F811
    model.fallback = pick_cheapest
    first = run(sandboxed, flights, CHEAPEST)
    assert chosen(sandboxed, first["id"]) == "You chose Play 09:10"
    flights.offers[:] = [("Air 07:00", 5120), ("Play 09:10", 4321), ("Sky 12:30", 3000)]
    second = run(sandboxed, flights, CHEAPEST)
    assert chosen(sandboxed, second["id"]) == "You chose Sky 12:30" and len(model.received) == 2
    assert "cheapest" in grounding_of(sandboxed, second["id"])["fresh"]
    assert entries(sandboxed) == []


def test_a_failed_action_keeps_nothing(sandboxed, flights, model):  # noqa: F811
    model.fallback = pick_play
    failed = run(sandboxed, flights, PLAY, kind="fill", state="failed")  # a button cannot be typed into
    assert grounding_of(sandboxed, failed["id"])["from"] == "model"
    assert entries(sandboxed) == [] and not GroundingEntry.objects.exists()
    again = run(sandboxed, flights, PLAY)
    assert grounding_of(sandboxed, again["id"])["from"] == "model" and asked_to_find(model) == 2


def test_an_expired_entry_is_not_used(sandboxed, flights, model, settings):  # noqa: F811
    model.fallback = pick_play
    run(sandboxed, flights, PLAY)
    settings.BOX_GROUNDING_CACHE_DAYS = 2
    GroundingEntry.objects.update(grounded_at=timezone.now() - timedelta(days=2, minutes=1))  # two days pass
    assert entries(sandboxed) == []
    later = run(sandboxed, flights, PLAY)
    assert grounding_of(sandboxed, later["id"])["from"] == "model" and len(model.received) == 2
    assert len(entries(sandboxed)) == 1  # chosen again, kept again


def test_one_workspaces_entries_are_not_used_by_another(sandboxed, flights, model):  # noqa: F811
    model.fallback = pick_play
    run(sandboxed, flights, PLAY)
    other = f"other-{uuid.uuid4().hex[:8]}"  # the box's workspaces directory outlives the test database
    assert sandboxed.api.post("/api/workspaces", {"name": other}, format="json").status_code == 201
    elsewhere = run(sandboxed, flights, PLAY, workspace=other)
    assert grounding_of(sandboxed, elsewhere["id"])["from"] == "model" and len(model.received) == 2
    home = run(sandboxed, flights, PLAY)
    assert grounding_of(sandboxed, home["id"])["from"] == "cache" and len(model.received) == 2
    assert {e["workspace"] for e in entries(sandboxed)} == {"home", other}
    assert [e["workspace"] for e in entries(sandboxed, workspace=other)] == [other]


# -- the owner's API -----------------------------------------------------------------------------
def _entry(owner: Any, workspace: str, instruction: str) -> None:
    task = Task.objects.create(owner=owner, title="t", workspace=Workspace.objects.get(name=workspace), worker="flow")
    remember(task, "http://shop.example/flights?page=2", instruction, kind="click",
             selector='role=button[name="Select" s]', fingerprint={"role": "button", "name": "Select"})


def test_the_owner_lists_and_clears_entries_and_a_phone_or_another_user_cannot(box):
    Workspace.objects.create(name="other", base_dir="other")
    _entry(box.owner, "home", "the Play flight")
    _entry(box.owner, "home", "the Sky flight")
    _entry(box.owner, "other", "the Play flight")
    listed = entries(box)
    assert [(e["workspace"], e["instruction"], e["origin"], e["path"]) for e in listed][-1] == \
        ("home", "the Play flight", "http://shop.example", "/flights")
    assert box.api.get("/api/browser/cache", {"workspace": "nowhere"}).json()["field"] == "workspace"

    phone = phone_client(pair_device(box.api))
    assert phone.get("/api/browser/cache").json()["code"] == "FORBIDDEN"
    assert phone.delete("/api/browser/cache").status_code == 403
    assert phone.delete(f"/api/browser/cache/{listed[0]['id']}").status_code == 403
    stranger = APIClient()
    stranger.force_login(make_owner())
    assert stranger.get("/api/browser/cache").json()["results"] == []
    assert stranger.delete(f"/api/browser/cache/{listed[0]['id']}").status_code == 404
    assert stranger.delete("/api/browser/cache").json() == {"cleared": 0}
    assert len(entries(box)) == 3

    sky = next(e for e in listed if e["instruction"] == "the Sky flight")
    assert box.api.delete(f"/api/browser/cache/{sky['id']}").status_code == 204
    assert box.api.delete("/api/browser/cache/nonsense").status_code == 400
    assert box.api.delete("/api/browser/cache?workspace=other").json() == {"cleared": 1}
    assert [(e["workspace"], e["instruction"]) for e in entries(box)] == [("home", "the Play flight")]
    assert box.api.delete("/api/browser/cache").json() == {"cleared": 1}
    assert entries(box) == []


def test_workers_writing_the_same_entry_at_once_leave_one(box):
    task = Task.objects.create(owner=box.owner, title="t", workspace=Workspace.objects.get(name="home"), worker="flow")
    start = threading.Barrier(6)
    failures: list[BaseException] = []

    def write(n: int) -> None:
        try:
            start.wait(timeout=10)
            remember(task, "http://shop.example/flights", "the Play flight", kind="click",
                     selector=f'role=button[name="Select {n}" s]', fingerprint={"role": "button", "name": f"Select {n}"})
        except BaseException as exc:  # noqa: BLE001 - reported below, whatever it is
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    [entry] = entries(box)
    assert entry["selector"] == f'role=button[name="{entry["fingerprint"]["name"]}" s]'  # one write, whole
