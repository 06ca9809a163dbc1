"""The served schema describes the API: it declares exactly the operations the URL map serves,
every endpoint's real responses (errors too) validate against it, and a client that knows only
the schema can create a task, read its events and approve a step."""
from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from jsonschema import Draft202012Validator
from rest_framework.test import APIClient
from rest_framework.views import APIView

from boxsite.core.auth import DEVICE_COOKIE
from tasks.browser.cache import remember
from tasks.models import Task
from tests.conftest import Box, wait_for
from tests.factories import flow
from tests.portal.conftest import pair_device
from tests.schema_check import Schema

GUARDED = flow({"write": {"path": "a.txt", "content": "a"}}, {"run": "cat a.txt", "stop_before": "print the file"},
               {"run": "true"})
# A browser's subscription keys: a P-256 point (the generator's) and a 16-byte auth secret, base64url.
PUSH_KEYS = {"p256dh": "BGsX0fLhLEJH-Lzm5WOkQPJ3A32BLeszoPShOUXYmMKWT-NC4v4af5uO5-tKfA-eFivOM1drMV7Oy7ZAaDe_UfU",
             "auth": "AAAAAAAAAAAAAAAAAAAAAA"}
ASKING = flow({"ask": {"name": "colour", "why": "which colour"}}, {"write": {"path": "c.txt", "content": "${colour}"}})


class CheckedClient:
    """An API client whose every JSON response is validated against the served schema."""

    def __init__(self, client: APIClient, schema: Schema) -> None:
        self.client, self.schema = client, schema
        self.seen: set[tuple[str, str]] = set()

    def call(self, method: str, url: str, body: Any = None, **query: Any) -> Any:
        response = self.client.generic(method, url, data="" if body is None else _json(body),
                                       content_type="application/json", QUERY_STRING=_qs(query))
        self.seen.add((method.lower(), self.schema.template_of(url)))
        if response.status_code != 204 and response["Content-Type"].startswith("application/json"):
            self.schema.check(method, url, response.status_code, response.json())
        return response


def _json(body: Any) -> str:
    return json.dumps(body)


def _qs(query: dict[str, Any]) -> str:
    return urlencode(query)


@pytest.fixture
def schema(box: Box) -> Schema:
    response = box.api.get("/api/schema/")
    assert response.status_code == 200
    document = response.json()
    Draft202012Validator.check_schema({"$defs": document["components"]["schemas"]})
    return Schema(document)


def _state(api: CheckedClient, task_id: str, *states: str) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        view = api.call("GET", f"/api/tasks/{task_id}").json()
        return view if view["state"] in states else None

    return wait_for(reached, what=f"{task_id} to be {states}")


def test_every_endpoints_responses_match_the_served_schema(box: Box, schema: Schema) -> None:
    api = CheckedClient(box.api, schema)
    ok = lambda response, *codes: response.status_code in (codes or (200,)) or pytest.fail(
        f"{response.status_code}: {response.content[:300]!r}")
    ok(api.call("GET", "/api/health"))
    ok(api.call("GET", "/api/tools"))
    ok(api.call("GET", "/api/settings"))
    ok(api.call("PATCH", "/api/settings", {"defaultBudgetCents": 5}))

    guarded = api.call("POST", "/api/tasks", {"title": "guarded", "flow": GUARDED}).json()
    _state(api, guarded["id"], "waiting")
    ok(api.call("GET", "/api/tasks", limit=1))
    later = api.call("POST", "/api/tasks", {"title": "later", "flow": GUARDED, "dependsOn": [guarded["id"]]}).json()
    ok(api.call("GET", f"/api/tasks/{guarded['id']}/dependencies"))
    other = api.call("POST", "/api/tasks", {"title": "other", "flow": GUARDED, "dependsOn": [guarded["id"]]}).json()
    ok(api.call("POST", f"/api/tasks/{later['id']}/dependencies", {"task": other["id"], "condition": "completion"}), 201)
    ok(api.call("GET", f"/api/tasks/{guarded['id']}/events"))
    ok(api.call("GET", f"/api/tasks/{guarded['id']}/diff"))
    ok(api.call("GET", "/api/inbox"))
    approval = api.call("GET", f"/api/tasks/{guarded['id']}").json()["approvals"][0]
    ok(api.call("GET", f"/api/approvals/{approval['id']}"))
    ok(api.call("POST", f"/api/approvals/{approval['id']}/approve", {}))
    _state(api, guarded["id"], "done")
    ok(api.call("POST", f"/api/approvals/{approval['id']}/deny", {}), 409)  # the error shape is declared too
    ok(api.call("GET", f"/api/tasks/{guarded['id']}/report"))
    ok(api.call("GET", f"/api/tasks/{guarded['id']}/runs", limit=1))
    ok(api.call("GET", f"/api/tasks/{guarded['id']}/actions", limit=1))
    ok(api.call("POST", f"/api/tasks/{guarded['id']}/keep"), 409)
    ok(api.call("POST", f"/api/tasks/{guarded['id']}/rerun", {"title": "again"}), 201)
    ok(api.call("POST", f"/api/tasks/{guarded['id']}/retry", {}), 409)  # only a recoverable failure
    short = api.call("POST", "/api/tasks", {"title": "short", "flow": GUARDED, "limits": {"max_actions": 1},
                                            "constraints": {"allow_destructive": True}}).json()
    _state(api, short["id"], "failed", "done")
    ok(api.call("POST", f"/api/tasks/{short['id']}/retry", {"limits": {"max_actions": 5}}))
    for event in api.call("GET", f"/api/tasks/{guarded['id']}/events").json()["events"]:
        for artifact in event["artifacts"] or []:
            api.seen.add(("get", schema.template_of(artifact["url"])))
            assert box.api.get(artifact["url"]).status_code == 200

    asking = api.call("POST", "/api/tasks", {"title": "ask", "flow": ASKING}).json()
    _state(api, asking["id"], "waiting")
    question = api.call("GET", f"/api/tasks/{asking['id']}").json()["questions"][0]
    ok(api.call("GET", f"/api/questions/{question['id']}"))
    ok(api.call("POST", f"/api/questions/{question['id']}/answer", {"inputs": {"colour": "red"}}))
    again = api.call("POST", "/api/tasks", {"title": "ask", "flow": ASKING}).json()
    _state(api, again["id"], "waiting")
    ok(api.call("POST", f"/api/tasks/{again['id']}/continue", {"inputs": {"colour": "blue"}}))
    third = api.call("POST", "/api/tasks", {"title": "ask", "flow": ASKING}).json()
    ok(api.call("POST", f"/api/tasks/{third['id']}/cancel"))
    ok(api.call("POST", f"/api/tasks/{third['id']}/undo"))

    ok(api.call("GET", "/api/workspaces"))
    ok(api.call("POST", "/api/workspaces", {"name": f"spare-{uuid.uuid4().hex[:8]}"}), 201)
    ok(api.call("GET", "/api/workspaces/home"))
    ok(api.call("GET", "/api/workspaces/home/files"))
    ok(api.call("GET", "/api/workspaces/home/files", path="a.txt"))
    ok(api.call("PUT", "/api/workspaces/home/files/put/b.txt", "uploaded"), 201)
    ok(api.call("GET", "/api/workspaces/home/files/put/b.txt"))
    ok(api.call("GET", "/api/workspaces/home/files/put/none.txt"), 404)
    ok(api.call("POST", "/api/workspaces/home/move", {"machine": "b"}), 400)  # one machine: nowhere to move to
    ok(api.call("POST", "/api/workspaces/home/abandon", {}), 400)  # one machine: nothing is lost
    ok(api.call("POST", "/api/vault", {"name": "KEY", "value": "v"}), 201)
    ok(api.call("GET", "/api/vault"))
    ok(api.call("DELETE", "/api/vault/KEY"), 204)
    for instruction in ("the Play flight", "the Sky flight"):  # what a browser step's action confirmed
        remember(Task.objects.get(pk=guarded["id"]), "http://shop.example/flights", instruction, kind="click",
                 selector='role=button[name="Select" s]', fingerprint={"role": "button", "name": "Select"})
    remembered = api.call("GET", "/api/browser/cache", workspace="home").json()["results"]
    ok(api.call("DELETE", f"/api/browser/cache/{remembered[0]['id']}"), 204)
    ok(api.call("DELETE", f"/api/browser/cache/{remembered[0]['id']}"), 404)
    ok(api.call("DELETE", "/api/browser/cache"))
    ok(api.call("GET", "/api/settings/model"))
    ok(api.call("GET", "/api/describe"))
    ok(api.call("PATCH", "/api/settings/model", {"baseUrl": "http://127.0.0.1:9/v1", "model": "m", "keyName": ""}))
    ok(api.call("POST", "/api/settings/model/test"))  # nothing listens there: the answer says so

    template = {"title": "t", "prompt": "p"}
    sched = api.call("POST", "/api/schedules", {"name": "s", "intervalSeconds": 3600, "template": template}).json()
    ok(api.call("GET", "/api/schedules"))
    ok(api.call("GET", f"/api/schedules/{sched['id']}"))
    ok(api.call("PATCH", f"/api/schedules/{sched['id']}", {"intervalSeconds": 7200}))
    ok(api.call("POST", f"/api/schedules/{sched['id']}/pause"))
    ok(api.call("POST", f"/api/schedules/{sched['id']}/resume"))
    ok(api.call("POST", f"/api/schedules/{sched['id']}/run"), 201)
    ok(api.call("GET", f"/api/schedules/{sched['id']}/firings"))
    ok(api.call("DELETE", f"/api/schedules/{sched['id']}"), 204)
    hook = api.call("POST", "/api/triggers", {"name": "w", "kind": "webhook", "template": template}).json()
    ok(api.call("GET", "/api/triggers"))
    ok(api.call("GET", f"/api/triggers/{hook['id']}"))
    ok(api.call("PATCH", f"/api/triggers/{hook['id']}", {"name": "w2"}))
    ok(api.call("POST", f"/api/triggers/{hook['id']}/pause"))
    ok(api.call("POST", f"/api/triggers/{hook['id']}/resume"))
    ok(api.call("POST", f"/api/triggers/{hook['id']}/rotate", {}))
    ok(api.call("POST", f"/api/triggers/{hook['id']}/rotate/finish"))
    ok(api.call("POST", f"/api/triggers/{hook['id']}/test", {}), 202)
    ok(api.call("GET", f"/api/triggers/{hook['id']}/deliveries"))
    ok(api.call("DELETE", f"/api/triggers/{hook['id']}"), 204)

    tokens = [api.call("POST", "/api/tokens", {"name": f"t{i}"}).json() for i in range(2)]
    ok(api.call("GET", "/api/tokens"))
    ok(api.call("DELETE", f"/api/tokens/{tokens[0]['id']}"))
    ok(api.call("POST", f"/api/tokens/{tokens[1]['id']}/revoke"))
    devices = []
    for _ in range(2):
        code = api.call("POST", "/api/pairing").json()["code"]
        phone = CheckedClient(APIClient(), schema)
        devices.append(phone.call("POST", "/api/pairing/claim", {"code": code, "name": "phone"}).json())
        api.seen |= phone.seen
    ok(api.call("GET", "/api/push/key"))
    subscription = api.call("POST", "/api/push/subscriptions", {"endpoint": "https://push.example/s/1", "keys": PUSH_KEYS})
    ok(subscription, 201)
    ok(api.call("GET", "/api/push/subscriptions"))
    ok(api.call("DELETE", f"/api/push/subscriptions/{subscription.json()['id']}"), 204)
    ok(api.call("POST", "/api/approval-links/not-signed-by-the-box"), 404)
    ok(api.call("GET", "/api/devices"))
    ok(api.call("DELETE", f"/api/devices/{devices[0]['id']}"))
    ok(api.call("POST", f"/api/devices/{devices[1]['id']}/revoke"))

    # Errors are declared per operation, in the one error shape.
    ok(api.call("GET", "/api/tasks/nosuchtask"), 404)
    ok(api.call("POST", "/api/tasks", {"title": "no flow", "flow": {"steps": []}}), 400)
    ok(api.call("GET", "/api/tasks", state="nosuchstate"), 400)
    ok(api.call("POST", f"/api/tasks/{guarded['id']}/cancel"), 409)
    ok(CheckedClient(APIClient(), schema).call("GET", "/api/tasks"), 401)

    declared = {(method, path) for path, item in schema.document["paths"].items() for method in item}
    assert declared - api.seen == set(), "operations no test call reached"


def _routes(patterns: list[Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Every route of the URL map, as an OpenAPI path template, with its view."""
    found: list[tuple[str, Any]] = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            found += _routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            found.append(("/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route), pattern.callback))
    return found


def _served_operations() -> set[tuple[str, str]]:
    """(method, path) for every API view the URL map routes to (the schema's own views aside)."""
    served = set()
    for path, callback in _routes(get_resolver().url_patterns):
        view = getattr(callback, "cls", None)
        if view is None or not issubclass(view, APIView) or view.__module__.startswith("drf_spectacular"):
            continue
        served |= {(method, path) for method in view.http_method_names
                   if method not in ("options", "head") and hasattr(view, method)}
    return served


def test_the_schema_declares_exactly_the_operations_the_box_serves(schema: Schema) -> None:
    declared = {(method, path) for path, item in schema.document["paths"].items() for method in item}
    served = _served_operations()
    assert declared - served == set(), "declared, not served"
    assert served - declared == set(), "served, not declared"
    assert ("post", "/api/tokens/{token_id}") not in declared and ("delete", "/api/tokens/{token_id}") in declared


def _signed_in(operation: dict[str, Any]) -> bool:
    return {} not in operation.get("security", [{}])


def test_every_operation_declares_its_errors_in_the_error_shape(schema: Schema) -> None:
    error = schema.document["components"]["schemas"]["ErrorBody"]
    assert {"code", "message", "field", "reference"} <= set(error["properties"])
    for path, item in schema.document["paths"].items():
        for method, operation in item.items():
            where = f"{method} {path}"
            responses = operation["responses"]
            assert "default" not in responses
            errors = {code for code in responses if code >= "400"}
            assert {"400", "406", "500", "503"} <= errors, where
            if _signed_in(operation):
                assert "401" in errors, where
                if method != "get":  # a cookie's change needs the CSRF token
                    assert "403" in errors, where
            else:
                assert not {"401", "403"} & errors, where
            if "{" in path:
                assert "404" in errors, where
            body = operation.get("requestBody", {}).get("content", {})
            assert ("413" in errors) == bool(body), where
            # The JSON parser refuses another type; a raw body (an upload) takes any.
            assert ("415" in errors) == ("application/json" in body), where
            for code in errors:
                assert responses[code]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}


def _probe_url(path: str, task_id: str) -> str:
    known = {"task_id": task_id, "name": "home", "path": "none.txt"}
    return re.sub(r"\{(\w+)\}", lambda m: known.get(m.group(1), "1"), path)


def test_the_declared_401_and_403_are_what_a_stranger_and_a_phone_are_answered(box: Box, schema: Schema) -> None:
    """Every signed-in operation answers 401 without credentials; a signed-in read answers a paired
    phone 403 exactly where it declares 403 (the rest show a phone its own things, or 404)."""
    task = box.create(title="t", prompt="p")
    phone = APIClient()
    phone.cookies[DEVICE_COOKIE] = pair_device(box.api)
    stranger = APIClient()
    reads = 0
    for path, item in schema.document["paths"].items():
        for method, operation in item.items():
            if not _signed_in(operation):
                continue
            url = _probe_url(path, task["id"])
            anonymous = stranger.generic(method.upper(), url, "{}", content_type="application/json")
            assert anonymous.status_code == 401, f"{method} {path}: {anonymous.status_code}"
            if method == "get":
                reads += 1
                refused = phone.get(url).status_code == 403
                assert refused == ("403" in operation["responses"]), f"{method} {path}"
    assert reads > 20


def test_timestamps_are_date_times_and_states_are_enums(schema: Schema) -> None:
    schemas = schema.document["components"]["schemas"]
    stamps = [(name, prop, spec) for name, component in schemas.items() if not name.endswith("Request")
              for prop, spec in component.get("properties", {}).items() if prop.endswith("At")]
    assert len(stamps) > 40
    assert [(name, prop) for name, prop, spec in stamps if spec.get("format") != "date-time"] == []
    assert schemas["TaskView"]["properties"]["state"]["enum"] == ["queued", "running", "waiting", "done", "failed",
                                                                    "cancelled", "undone"]
    assert schemas["TaskView"]["properties"]["step"]["type"] == "string"
    steps = schemas["TaskView"]["properties"]["flow"]["anyOf"][0]["properties"]["steps"]["items"]["oneOf"]
    assert {next(iter(s["required"])) for s in steps} >= {"run", "write", "http", "ask", "approve"}


def test_an_events_data_is_held_to_the_shape_of_its_kind(schema: Schema) -> None:
    event = Draft202012Validator({"$ref": "#/components/schemas/Event", "components": schema.document["components"]})

    def problems(kind: str, data: dict[str, Any]) -> list[str]:
        shown = {"id": 1, "seq": 1, "kind": kind, "summary": "", "data": data, "costCents": 0, "artifacts": None,
                 "createdAt": "2026-01-01T00:00:00+00:00"}
        return [e.message for e in event.iter_errors(shown)]

    result = {"step": 2, "of": 3, "kind": "run", "ok": True, "startedAt": "2026-01-01T00:00:00+00:00", "durationMs": 5}
    assert problems("step_result", {**result, "exitCode": 0}) == []  # a step's evidence adds its own keys
    assert problems("step_result", {k: v for k, v in result.items() if k != "ok"}) != []
    assert problems("step_result", {**result, "durationMs": "5"}) != []
    assert problems("blocked_connection", {"host": "example.com", "port": 443, "reason": "not listed", "via": "egress proxy"}) == []
    assert problems("blocked_connection", {"host": "example.com", "port": 443, "reason": "not listed"}) != []
    assert problems("approval", {"approval": 1, "kind": "spending", "amount_cents": 5, "secret": "x"}) != []  # closed
    assert problems("tool_call", {"tool": "http.request", "args": {}, "refused": 3}) != []
    assert problems("note", {"anything": ["the noted thing's own"]}) == []


def test_the_schema_is_served_to_a_client_that_asks_for_plain_json(box: Box) -> None:
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert "/api/tasks" in json.loads(response.content)["paths"]


def test_a_client_driven_only_by_the_schema_creates_a_task_reads_its_events_and_approves_a_step(box: Box) -> None:
    document = Client().get("/api/schema/").json()  # the schema itself needs no sign-in
    operations = {op["operationId"]: (method.upper(), path) for path, item in document["paths"].items()
                  for method, op in item.items()}
    schema = Schema(document)
    api = CheckedClient(box.api, schema)

    def call(operation_id: str, body: Any = None, **params: Any) -> dict[str, Any]:
        method, path = operations[operation_id]
        response = api.call(method, path.format(**params), body)
        assert response.status_code < 300, response.content
        return response.json()

    spec_schema = document["components"]["schemas"]["TaskSpecBodyRequest"]
    assert "title" in spec_schema["required"] and "flow" in spec_schema["properties"]
    task = call("tasks_create", {"title": "from the schema", "flow": GUARDED})
    def in_state(state: str) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            view = call("tasks_retrieve", task_id=task["id"])
            return view if view["state"] == state else None

        return wait_for(reached, what=f"the task to be {state}")

    view = in_state("waiting")
    events = call("tasks_events_retrieve", task_id=task["id"])["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    call("approvals_approve_create", {"version": view["version"]}, approval_id=view["approvals"][0]["id"])
    done = in_state("done")
    assert "approve" not in done["next"]


# Response properties that are any JSON or an object without declared keys, each with why: what a
# caller or a program gave (a task's facts, records, result), what an outside system answered, or
# what each of many writers shapes its own way. Every fixed shape is typed.
FREE_FORM = {
    "TaskView.facts": "the facts the caller gave, by the caller's names",
    "TaskView.output": "the output contract's JSON Schema, as the caller gave it",
    "TaskView.result": "the answer shaped to the caller's output schema",
    "TaskView.answer": "what the agent or the flow's last step answered: any JSON",
    "Report.records": "what the steps saved, by the flow's names",
    "Report.output": "the output contract's JSON Schema, as the caller gave it",
    "Report.result": "the answer shaped to the caller's output schema",
    "OutputData.result": "the answer shaped to the caller's output schema",
    "QuestionView.answer": "the inputs the owner gave, by the question's names",
    "InputField.options.items": "an ask step's options, as its flow lists them",
    "OutputFileCriterion.json": "JSON Pointers to the values the caller expects there",
    "StepGuide.schema": "a JSON Schema (the schema of a step)",
    "Tool.schema": "a JSON Schema (a tool's arguments)",
    "ToolCallData.args": "a tool's arguments, as the agent called it",
    "ToolResultData.result": "what the tool answered",
    "ActionView.args": "a tool's arguments, as the agent called it",
    "ApprovalView.guard": "the exact flow step or tool call approved: its own shape",
    "Event.data": "typed per kind (allOf); a kind not listed there (a note) carries its writer's keys",
    "ApprovalView.detail": "what the asking step or tool shows of itself: a planned action, a charge, a page",
    "ActionView.receipt": "a tool's own outcome (an HTTP step's: status, size, digest, an excerpt)",
    "ToolResultData.receipt": "a tool's own outcome",
    "Rescue.data": "the rescue event's data, as the rescuer wrote it",
}


def _untyped(spec: dict[str, Any], where: str) -> Iterator[str]:
    """``where`` (and the schemas inside it) when it is any JSON or an object without keys."""
    kinds = spec.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    loose_object = "object" in kinds and "properties" not in spec and "additionalProperties" not in spec
    if not {k for k in spec if k != "description"} or loose_object:
        yield where
    for key in ("items", "additionalProperties"):
        if isinstance(spec.get(key), dict):
            yield from _untyped(spec[key], f"{where}.{key}")
    for key in ("anyOf", "oneOf"):
        for member in spec.get(key, []):
            yield from _untyped(member, where)


def test_no_response_property_is_an_untyped_object_but_the_free_form_ones(schema: Schema) -> None:
    schemas = schema.document["components"]["schemas"]
    task_props = set(schemas["TaskView"]["properties"])
    found = set()
    for name, component in schemas.items():
        if name.endswith("Request"):
            continue
        for prop, spec in component.get("properties", {}).items():
            # A TaskView with more (TaskDetail, TaskKept) answers for its TaskView part there.
            owner = "TaskView" if name in ("TaskDetail", "TaskKept") and prop in task_props else name
            found |= set(_untyped(spec, f"{owner}.{prop}"))
    assert found - FREE_FORM.keys() == set(), "untyped, and not listed as free-form"
    assert FREE_FORM.keys() - found == set(), "listed, but typed now: take it off the list"
    view = schemas["TaskView"]["properties"]
    assert view["spent"] == {"$ref": "#/components/schemas/TaskSpent"}
    assert view["dependsOn"]["items"] == {"$ref": "#/components/schemas/DependsOnItem"}
    assert schemas["QuestionView"]["properties"]["fields"]["items"] == {"$ref": "#/components/schemas/InputField"}
    assert schemas["Health"]["properties"]["isolation"]["$ref"] == "#/components/schemas/IsolationView"


def test_the_declared_415_is_what_a_body_of_another_type_is_answered(box: Box, schema: Schema) -> None:
    """Every operation that declares a JSON body refuses a text body with 415 in the error shape;
    one that takes a raw body (an upload) never answers 415."""
    task = box.create(title="t", prompt="p")
    probed = 0
    for path, item in schema.document["paths"].items():
        for method, operation in item.items():
            body = operation.get("requestBody", {}).get("content", {})
            if not body or not _signed_in(operation):
                continue
            answer = box.api.generic(method.upper(), _probe_url(path, task["id"]), "plain words",
                                     content_type="text/plain")
            where = f"{method} {path}: {answer.status_code}"
            if "application/json" in body:
                assert answer.status_code == 415, where
                assert answer.json()["code"], where
                probed += 1
            else:
                assert answer.status_code != 415, where
    assert probed > 20
