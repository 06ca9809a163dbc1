"""``constraints.browser_profile``: a folder of the owner's the task's browser keeps its profile
in, so a site signed into by one task is still signed in for the next; one browser at a time."""
from __future__ import annotations

import os

import pytest
from rest_framework.test import APIClient

from boxsite.core.auth import issue_api_token
from tasks.models import Task
from tests.browser.test_walls_payment import CARD, chromium_of
from tests.factories import flow

ACCOUNT_STEPS = ({"extract": "#who", "save": "who"}, {"extract": "#stored", "save": "stored"})


def test_a_profile_keeps_the_sign_in_for_the_next_task(sandboxed, site, tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    constraints = {"browser_profile": str(profile)}
    first = sandboxed.create(title="sign in", hosts=["127.0.0.1"], constraints=constraints, flow=flow(
        {"browse": f"{site.url}/signin?name=ana"}, {"browse": f"{site.url}/account"}, *ACCOUNT_STEPS))
    view = sandboxed.wait_state(first["id"], "done", "failed", timeout=120)
    assert view["state"] == "done", view["error"]
    assert Task.objects.get(pk=first["id"]).records["who"] == [{"value": "Signed in as ana"}]
    assert any(profile.iterdir())  # Chromium wrote its profile into the owner's folder
    assert all(os.lstat(p).st_uid == 0 for p in profile.rglob("*"))  # root's on disk, whoever ran it

    second = sandboxed.create(title="account", hosts=["127.0.0.1"], constraints=constraints,
                              flow=flow({"browse": f"{site.url}/account"}, *ACCOUNT_STEPS))
    view = sandboxed.wait_state(second["id"], "done", "failed", timeout=120)
    assert view["state"] == "done", view["error"]
    records = Task.objects.get(pk=second["id"]).records
    assert records["who"] == [{"value": "Signed in as ana"}] and records["stored"] == [{"value": "hello again"}]

    fresh = sandboxed.create(title="no profile", hosts=["127.0.0.1"], flow=flow({"browse": f"{site.url}/account"}, *ACCOUNT_STEPS))
    assert sandboxed.wait_state(fresh["id"], "done", "failed", timeout=120)["state"] == "done"
    assert Task.objects.get(pk=fresh["id"]).records["who"] == [{"value": "Not signed in"}]


def test_a_second_browser_on_a_held_profile_is_refused_clearly(sandboxed, site, tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    holder = sandboxed.create(title="pay", hosts=["127.0.0.1"], facts={"card_number": CARD},
                              constraints={"browser_profile": str(profile)},
                              flow=flow({"browse": f"{site.url}/pay"}, {"fill": {"label": "Card number", "value": "${card_number}"}}))
    view = sandboxed.wait_state(holder["id"], "waiting", "failed", timeout=120)
    assert view["waitingFor"] == "checkpoint" and chromium_of(holder["id"])  # it keeps its browser, and the profile
    other = sandboxed.create(title="account", hosts=["127.0.0.1"], constraints={"browser_profile": str(profile)},
                             flow=flow({"browse": f"{site.url}/account"}))
    view = sandboxed.wait_state(other["id"], "done", "failed", timeout=120)
    assert view["state"] == "failed" and f"in use by task {holder['id']}" in view["error"], view["error"]
    assert sandboxed.api.post(f"/api/tasks/{holder['id']}/cancel").status_code == 200


@pytest.mark.parametrize("value, code", [("profile", "INVALID_SPEC"), ("/nonexistent/profile", "INVALID_SPEC"), ("/", "INVALID_SPEC")])
def test_a_profile_folder_is_checked_at_spec_time(box, value, code):
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow({"browse": "https://example.org"}),
                                           "constraints": {"browser_profile": value}}, format="json")
    body = response.json()
    assert (response.status_code, body["code"], body["field"]) == (400, code, "constraints.browser_profile")
    assert not Task.objects.exists()


def test_only_the_owner_gives_a_profile_folder(box, tmp_path):
    _, raw = issue_api_token(box.owner, "no-folders", can_use_folders=False)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post("/api/tasks", {"title": "t", "flow": flow({"browse": "https://example.org"}),
                                          "constraints": {"browser_profile": str(tmp_path)}}, format="json")
    assert response.status_code == 403 and response.json()["field"] == "constraints.browser_profile"
