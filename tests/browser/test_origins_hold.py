"""``constraints.origins`` holds on every navigation: a redirect hop, a link, a frame and a
popup to another site are refused before a request leaves, and logged with the URL; service
workers are blocked; the HTTP cache stays on."""
from __future__ import annotations

from tests.factories import flow


def _refused(box, task_id: str) -> list[dict]:
    return [e["data"] for e in box.events(task_id) if e["kind"] == "blocked_connection" and e["data"]["via"] == "browser"]


def test_a_redirect_to_another_origin_is_refused_before_it_is_followed(sandboxed, site):
    elsewhere = f"http://localhost:{site.port}/form"
    task = sandboxed.create(title="redirect", hosts=["127.0.0.1", "localhost"], constraints={"origins": [site.url]},
                            flow=flow({"browse": f"{site.url}/to?url={elsewhere}"}))
    view = sandboxed.wait_state(task["id"], "failed", "done", timeout=90)
    assert view["state"] == "failed" and "a redirect led to" in view["error"] and "not in constraints.origins" in view["error"]
    assert site.gets["/to"] == 1 and site.gets["/form"] == 0
    assert [(r["url"], r.get("redirect")) for r in _refused(sandboxed, task["id"])] == [(elsewhere, True)]


def test_a_link_and_a_frame_to_another_origin_are_refused(sandboxed, site):
    other = f"http://localhost:{site.port}"
    task = sandboxed.create(title="links", hosts=["127.0.0.1", "localhost"], constraints={"origins": [site.url]},
                            flow=flow({"browse": f"{site.url}/framed?frame={other}/card-frame"},
                                      {"browse": f"{site.url}/away?to={other}/shop"},
                                      {"click": {"text": "Go on"}}))
    view = sandboxed.wait_state(task["id"], "failed", "done", timeout=90)
    assert view["state"] == "failed" and "the page tried to go to" in view["error"], view
    assert site.gets["/card-frame"] == 0 and site.gets["/shop"] == 0
    assert [r["url"] for r in _refused(sandboxed, task["id"])] == [f"{other}/card-frame", f"{other}/shop"]


def test_service_workers_are_blocked_and_the_cache_stays_on(sandboxed, site):
    task = sandboxed.create(title="cache", hosts=["127.0.0.1"], constraints={"origins": [site.url]},
                            flow=flow({"browse": f"{site.url}/worker"}, {"extract": "#sw", "save": "worker"},
                                      {"browse": f"{site.url}/cached"}, {"browse": f"{site.url}/cached"},
                                      {"extract": "#c", "save": "script"}))
    view = sandboxed.wait_state(task["id"], "failed", "done", timeout=90)
    assert view["state"] == "done", view
    records = sandboxed.api.get(f"/api/tasks/{task['id']}/report").json()["records"]
    assert (records["worker"], records["script"]) == ([{"value": "none"}], [{"value": "script ran"}])
    assert site.gets["/cached"] == 2 and site.gets["/cached.js"] == 1
