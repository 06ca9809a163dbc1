"""Hostile inputs the way outside testers send them: every one gets an answer in the box's error
shape (or the page again), never a 500, an HTML error page or a hang, on SQLite and PostgreSQL
alike. ``test_edges`` holds the first round; these are the ones it did not reach. Each test
sends many inputs to one box: a box per input would make the module too slow to run twice."""
from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from schedules.signatures import github_header
from tests.api.test_edges import assert_error
from tests.conftest import Box
from tests.factories import flow

WRITE = flow({"write": {"path": "a.txt", "content": "a"}})
LONE = '"\\ud800"'  # a lone surrogate, as JSON writes it: valid JSON, not storable text
HUGE = ["1" + "0" * 30, "-1" + "0" * 30, str(2**63), str(2**64), "1e309", "-1e309"]
TEMPLATE = '"template": {"title": "t", "prompt": "p"}'
BAD_UTF8 = "%ED%A0%80%FF"  # a surrogate's UTF-8 form and a stray byte, as a form posts them


def _send(client: APIClient | Client, url: str, body: str, method: str = "post") -> Any:
    return getattr(client, method)(url, body, content_type="application/json")


def _answered(response: Any, *statuses: int) -> dict[str, Any] | None:
    """The response is one of ``statuses``; when it is an error, in the error shape."""
    assert response.status_code in statuses, (response.status_code, response.content[:300])
    if response.status_code < 400:
        return None
    return assert_error(response, response.status_code, response.json()["code"])


def _task(box: Box) -> str:
    return str(box.create(title="t", flow=WRITE)["id"])


# -- JSON the parser read but no database (or answer) could hold ------------------------------

@pytest.mark.parametrize(("url", "body", "field"), [
    ("/api/tasks", '{"title": ' + LONE + ', "prompt": "p"}', "title"),
    ("/api/tasks", '{"title": "t", "prompt": "p", "facts": {' + LONE + ': "v"}}', "facts"),
    ("/api/vault", '{"name": "k", "value": ' + LONE + "}", "value"),
    ("/api/vault", '{"name": ' + LONE + ', "value": "v"}', "name"),
    ("/api/tokens", '{"name": ' + LONE + "}", "name"),
    ("/api/schedules", '{"name": ' + LONE + ', "intervalSeconds": 60, ' + TEMPLATE + "}", "name"),
])
def test_a_lone_surrogate_in_a_json_string_is_refused(box: Box, url: str, body: str, field: str) -> None:
    assert_error(_send(box.api, url, body), 400, "INVALID_REQUEST", field)


def test_a_number_too_large_for_a_float_is_refused_naming_it(box: Box) -> None:
    for number in ("1e309", "-1e309"):
        for url, body, field in [
            ("/api/tasks", '{"title": "t", "prompt": "p", "facts": {"a": %s}}', "facts.a"),
            ("/api/tasks", '{"title": "t", "prompt": "p", "memory": [%s]}', "memory.0"),
            ("/api/tasks", '{"title": "t", "flow": {"steps": [{"run": "true", "timeout_s": %s}]}}', "flow.steps.0.timeout_s"),
            ("/api/schedules", '{"name": "s", "intervalSeconds": %s, ' + TEMPLATE + "}", "intervalSeconds"),
            ("/api/triggers", '{"name": "w", "kind": "webhook", "template": {"title": "t", "prompt": "p", "x": %s}}',
             "template.x"),
        ]:
            assert_error(_send(box.api, url, body % number), 400, "INVALID_REQUEST", field)
        assert_error(_send(box.api, "/api/settings/model", '{"inputCentsPerMillion": %s}' % number, "patch"),
                     400, "INVALID_REQUEST", "inputCentsPerMillion")
    assert box.api.get("/api/tasks").json()["results"] == []


def test_nan_and_infinity_literals_are_refused(box: Box) -> None:
    for literal in ("NaN", "Infinity", "-Infinity"):
        response = _send(box.api, "/api/tasks", '{"title": "t", "prompt": "p", "facts": {"a": %s}}' % literal)
        assert_error(response, 400, "INVALID_REQUEST", "body")


def test_a_huge_number_in_a_numeric_field_is_refused(box: Box) -> None:
    bodies = [("/api/tasks", '{"title": "t", "prompt": "p", "budgetCents": %s}'),
              ("/api/tasks", '{"title": "t", "prompt": "p", "limits": {"max_elapsed_ms": %s}}'),
              ("/api/tasks", '{"title": "t", "prompt": "p", "externalAttempt": %s}'),
              ("/api/tasks", '{"title": "t", "prompt": "p", "dependsOn": [%s]}'),
              ("/api/tasks", '{"title": "t", "prompt": "p", "parent": %s}'),
              ("/api/schedules", '{"name": "s", "intervalSeconds": %s, ' + TEMPLATE + "}"),
              ("/api/triggers", '{"name": "w", "kind": "file", "settleSeconds": %s, ' + TEMPLATE + "}")]
    for number in HUGE:
        for url, body in bodies:
            _answered(_send(box.api, url, body % number), 400)
        for name in ("maxActiveTasks", "defaultBudgetCents", "retentionDays", "taskCpuPercent", "maxActionsPerDay"):
            assert_error(_send(box.api, "/api/settings", '{"%s": %s}' % (name, number), "patch"), 400, "INVALID_REQUEST")


def test_a_body_that_is_not_an_object_is_refused(box: Box) -> None:
    task_id = _task(box)
    calls = [("post", "/api/tasks"), ("post", "/api/schedules"), ("post", "/api/triggers"), ("post", "/api/vault"),
             ("patch", "/api/settings"), ("post", "/api/tokens"), ("post", "/api/pairing/claim"),
             ("patch", "/api/settings/model"), ("post", "/api/describe"), ("post", "/api/workspaces")]
    calls += [("post", f"/api/tasks/{task_id}/{verb}") for verb in ("continue", "retry", "rerun", "keep")]
    for body in ("[]", "[1, 2]", "1", '"text"', "null", "true"):
        for method, url in calls:
            _answered(_send(box.api, url, body, method), 400, 405, 409)


# -- numbers, cursors and odd ids in paths and query parameters -------------------------------

def test_a_huge_or_odd_number_in_an_events_query_is_refused(box: Box) -> None:
    task_id = _task(box)
    for value in HUGE + ["1.5", "nan", "inf", "-0", " 1", "1_0", "\u0661"]:
        for name in ("after", "limit"):
            for url in (f"/api/tasks/{task_id}/events", f"/api/tasks/{task_id}"):
                response = box.api.get(url, {name: value})
                if response.status_code != 200:  # a form int() reads as a number ("-0", " 1") is fine
                    assert_error(response, 400, "INVALID_REQUEST", name)


def test_a_huge_limit_on_a_list_is_refused_or_ignored(box: Box) -> None:
    for value in HUGE + ["-1", "1.5", "nan"]:
        for url in ("/api/tasks", "/api/schedules", "/api/triggers", "/api/inbox", "/api/tokens", "/api/devices",
                    "/api/vault", "/api/workspaces"):
            body = _answered(box.api.get(url, {"limit": value}), 200, 400)
            assert body is None or body["field"] == "limit"


def test_a_garbage_cursor_is_refused(box: Box) -> None:
    for cursor in ("!!!", "AAAA", "a" * 5000, "eyJzb3J0IjoiLWNyZWF0ZWQifQ", "e30:1abc:xyz",
                   ".eJyrVkrOLypRsjLQUUpKLCpRsqpWykvMTVWyUkopT8xIV6qtBQDOlgqG"):
        for url in ("/api/tasks", "/api/schedules", "/api/triggers"):
            assert_error(box.api.get(url, {"cursor": cursor}), 400, "INVALID_REQUEST", "cursor")


def test_a_cursor_of_another_list_is_refused(box: Box) -> None:
    for i in range(3):
        box.api.post("/api/schedules", {"name": f"s{i}", "intervalSeconds": 60, "template": {"title": "t", "prompt": "p"}})
        box.create(title=f"t{i}", flow=WRITE)
    schedules = box.api.get("/api/schedules", {"limit": 1, "sort": "name"}).json()
    tasks = box.api.get("/api/tasks", {"limit": 1}).json()
    assert_error(box.api.get("/api/tasks", {"cursor": schedules["next"]}), 400, "INVALID_REQUEST", "cursor")
    task_id = tasks["results"][0]["id"]
    assert_error(box.api.get(f"/api/tasks/{task_id}/runs", {"cursor": tasks["next"]}), 400, "INVALID_REQUEST", "cursor")


def test_an_odd_id_in_a_path_is_a_json_4xx(box: Box) -> None:
    routes = ["/api/tasks/{}", "/api/tasks/{}/events", "/api/schedules/{}", "/api/triggers/{}", "/api/approvals/{}",
              "/api/questions/{}", "/api/tokens/{}", "/api/devices/{}", "/api/vault/{}", "/api/workspaces/{}", "/hooks/{}"]
    for segment in ("1" + "0" * 30, str(2**63), str(2**64), "-1", "1e309", "%ED%A0%80", "..", "%2e%2e"):
        for route in routes:
            response = box.api.get(route.format(segment))
            assert 400 <= response.status_code < 500, (route, segment, response.status_code, response.content[:300])
            if response.status_code != 405:
                assert_error(response, response.status_code, response.json()["code"])
    for segment in ("1" + "0" * 30, str(2**63), str(2**64)):
        assert_error(box.api.delete(f"/api/tokens/{segment}"), 404, "NOT_FOUND")
        assert_error(box.api.delete(f"/api/devices/{segment}"), 404, "NOT_FOUND")
        assert_error(box.api.post(f"/api/tokens/{segment}/revoke"), 404, "NOT_FOUND")


# -- headers and cookies ----------------------------------------------------------------------

def test_a_nul_in_a_header_is_answered_in_the_error_shape(box: Box) -> None:
    odd = {"HTTP_AUTHORIZATION": "Bearer box_\x00x", "HTTP_COOKIE": "sessionid=abc\x00def12345; box_device=x\x00y"}
    for header in ("HTTP_AUTHORIZATION", "HTTP_COOKIE", "HTTP_X_CSRFTOKEN", "HTTP_ACCEPT", "HTTP_IF_NONE_MATCH",
                   "HTTP_ORIGIN", "HTTP_REFERER"):
        _answered(APIClient().get("/api/tasks", **{header: odd.get(header, "a\x00b")}), 400, 401, 403, 406)


def test_a_nul_or_stray_byte_in_a_cookie_on_a_page_is_not_a_500(box: Box) -> None:
    # A WSGI server hands headers over as latin-1 text: UTF-8 bytes arrive as these characters.
    for cookie in ("sessionid=abcdefgh\x00ijklmnop", "sessionid=" + "\xed\xa0\x80" * 9, "box_device=box_\x00abc",
                   "csrftoken=\x00"):
        for url in ("/", "/tasks", "/inbox", "/login", "/ask"):
            response = Client().get(url, HTTP_COOKIE=cookie)
            assert response.status_code < 500, (url, cookie, response.status_code, response.content[:300])


# -- webhooks ---------------------------------------------------------------------------------

@pytest.fixture
def hook(box: Box) -> dict[str, Any]:
    response = box.api.post("/api/triggers", {"name": "gh", "kind": "webhook", "template": {"title": "t", "prompt": "p"}})
    assert response.status_code == 201, response.json()
    return dict(response.json())


def _deliver(hook: dict[str, Any], body: bytes, signature: str | None = "sign", delivery: str = "d1",
             content_type: str = "application/json", **headers: Any) -> Any:
    if signature == "sign":
        signature = github_header(hook["secret"], body)
    if signature is not None:
        headers["HTTP_X_HUB_SIGNATURE_256"] = signature
    return Client().post(hook["path"], data=body, content_type=content_type, HTTP_X_GITHUB_DELIVERY=delivery, **headers)


def test_a_webhook_with_a_forged_or_missing_signature_is_refused(hook: dict[str, Any]) -> None:
    for signature in (None, "", "sha256=", "sha256=zz", "sha256=" + "0" * 64, "sha1=abc", "sha256=\x00",
                      "sha256=" + "\xe9" * 64):
        _answered(_deliver(hook, b'{"a": 1}', signature), 400, 401, 403)


def test_a_signed_webhook_with_a_hostile_body_or_header_is_answered(hook: dict[str, Any]) -> None:
    bodies = [b'{"a": 1e309}', b'{"a": NaN}', b"[" * 10_000 + b"]" * 10_000, b"\xff\xfe", b"[1, 2]", b"null", b'"x"',
              b"1" * 5000, b'{"a": 1, "a": 2}', b'{"a": ' + b"1" * 4000 + b"}"]
    for n, body in enumerate(bodies):
        _answered(_deliver(hook, body, delivery=f"b{n}"), 200, 202, 400)
    odd = "a\x00\xed\xa0\x80"
    _answered(_deliver(hook, b'{"a": 1}', delivery=odd), 200, 202, 400)
    _answered(_deliver(hook, b'{"a": 1}', delivery="h1", HTTP_X_GITHUB_EVENT=odd), 200, 202, 400)


def test_a_webhook_payload_with_a_lone_surrogate_is_refused_not_stored(box: Box, hook: dict[str, Any]) -> None:
    for n, body in enumerate([b'{"a": "\\ud800"}', b'{"\\udfff": 1}', b'{"a": ["x\\ud800y"]}']):
        assert_error(_deliver(hook, body, delivery=f"s{n}"), 400, "INVALID_REQUEST", "body")
    listed = box.api.get("/api/tasks")
    assert listed.status_code == 200 and listed.json()["results"] == [], listed.content[:300]


# -- schedules, the task spec, the vault, workspaces ------------------------------------------

def test_an_odd_cron_is_refused_or_kept_never_a_hang(box: Box) -> None:
    for n, cron in enumerate(["0-99999999999999999999 * * * *", "*/0 * * * *", "* * * * * * * *", "1-2-3 * * * *",
                              "@reboot", "@yearly\x00", "99999999999999999999 * * * *", "* * * * 8", "0 0 29 2 *", " ",
                              "0 0 * * 1#9"]):
        response = box.api.post("/api/schedules", {"name": f"s{n}", "cron": cron, "template": {"title": "t", "prompt": "p"}})
        body = _answered(response, 201, 400)
        assert body is None or body["field"] == "cron", (cron, body)


def test_a_cron_no_date_matches_is_refused_naming_it(box: Box) -> None:
    for cron in ("0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *"):
        response = box.api.post("/api/schedules", {"name": "s", "cron": cron, "template": {"title": "t", "prompt": "p"}})
        body = assert_error(response, 400, "INVALID_REQUEST", "cron")
        assert "never" in body["message"]


def test_an_odd_time_zone_is_refused(box: Box) -> None:
    for zone in ("Mars/Olympus", "../../etc/passwd", "/etc/localtime", "UTC\x00", "a" * 5000, "America", "Europe/"):
        response = box.api.post("/api/schedules", {"name": "s", "cron": "0 9 * * *", "timezone": zone,
                                                   "template": {"title": "t", "prompt": "p"}})
        assert_error(response, 400, "INVALID_REQUEST", "timezone")
        if len(zone) < 64:
            assert_error(box.api.patch("/api/settings", {"timeZone": zone}), 400, "INVALID_REQUEST", "timeZone")


def test_an_odd_depends_on_is_refused(box: Box) -> None:
    for depends in (["tk\x00"], ["x" * 10_000], [1e308], [None], [[]], [{}], "tk1", [True], ["self"], ["../tk1"]):
        response = box.api.post("/api/tasks", {"title": "t", "flow": WRITE, "dependsOn": depends})
        assert 400 <= response.status_code < 500, (depends, response.status_code, response.content[:300])
        assert_error(response, response.status_code, response.json()["code"])


def test_an_odd_vault_name_is_refused(box: Box) -> None:
    for name in ("a\x00", "\ud800", "a" * 5000, "../x", "", " ", "1a"):
        assert_error(_send(box.api, "/api/vault", json.dumps({"name": name, "value": "v"})), 400, "INVALID_REQUEST")


def test_an_odd_workspace_browse_path_is_a_json_4xx(box: Box) -> None:
    for path in ("a\x00", "../..", "/etc", "%00"):
        _answered(box.api.get("/api/workspaces/home/files", {"path": path}), 400, 404)


def test_a_browse_path_longer_than_the_file_system_takes_is_refused(box: Box) -> None:
    for path in ("a" * 256, "a/" * 2100, "\xe9" * 128, "a" * 5000):
        assert_error(box.api.get("/api/workspaces/home/files", {"path": path}), 400, "INVALID_REQUEST", "path")


# -- portal pages -----------------------------------------------------------------------------

def _owner_client(box: Box) -> Client:
    client = Client()
    client.force_login(box.owner)
    return client


def _post_form(client: Client, url: str, form: dict[str, str] | str) -> Any:
    if isinstance(form, str):
        return client.post(url, form, content_type="application/x-www-form-urlencoded")
    return client.post(url, form)


def test_a_page_with_a_hostile_path_or_query_is_not_a_500(box: Box) -> None:
    client = _owner_client(box)
    for url in ("/tasks/tk%00x", "/tasks/%ED%A0%80", "/tasks/" + "9" * 40, "/tasks?state=%00", "/tasks?q=%00",
                "/tasks?cursor=%00", "/tasks?cursor=garbage", "/tasks?limit=" + "9" * 40, "/inbox?cursor=%00",
                "/schedules?status=%00", "/triggers?q=%00", "/pair?code=%00", "/ask?q=%00", "/?after=%00",
                "/settings?tab=%00", "/tasks?after=1e309"):
        response = client.get(url)
        assert response.status_code < 500, (url, response.status_code, response.content[:300])


def test_the_sign_in_pair_and_setup_forms_with_hostile_fields_rerender(box: Box) -> None:
    for form in ({"username": "a\x00", "password": "x"}, f"username={BAD_UTF8}&password=x",
                 {"username": "a" * 100_000, "password": "x"}, {"username": "a", "password": "\x00"}):
        response = _post_form(Client(), "/login", form)
        assert response.status_code in (200, 400, 403, 429), (form, response.status_code, response.content[:300])
    for form in ({"code": "\x00"}, {"code": "123456", "name": "a\x00"}, {"code": "9" * 100_000}, f"code={BAD_UTF8}"):
        response = _post_form(Client(), "/pair", form)
        assert response.status_code < 500, (form, response.status_code, response.content[:300])
    for form in ({"username": "a\x00", "password": "longenough1", "password2": "longenough1"},
                 f"username={BAD_UTF8}&password=longenough1&password2=longenough1",
                 {"username": "a", "password": "\x00" * 12, "password2": "\x00" * 12}):
        response = _post_form(Client(), "/setup", form)
        assert response.status_code < 500, (form, response.status_code, response.content[:300])


def test_the_ask_and_portal_forms_with_hostile_fields_are_not_a_500(box: Box) -> None:
    client = _owner_client(box)
    for form in ({"prompt": "a\x00"}, f"prompt={BAD_UTF8}", {"prompt": "x" * 200_000}, {"title": "\x00", "prompt": "p"},
                 {"prompt": "p", "budgetCents": "1" + "0" * 30}, {"prompt": "p", "workspace": "\x00"}, {}):
        response = _post_form(client, "/ask", form)
        assert response.status_code < 500, (form, response.status_code, response.content[:300])
    for url in ("/schedules", "/triggers", "/settings", "/inbox", "/tasks"):
        for form in ({"name": "\x00"}, {"action": "\x00", "id": "1" + "0" * 30}, f"id={BAD_UTF8}&action=pause",
                     {"intervalSeconds": "1e309"}):
            response = _post_form(client, url, form)
            assert response.status_code < 500, (url, form, response.status_code, response.content[:300])
