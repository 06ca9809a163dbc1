"""Property-based: any request to any API endpoint gets an answer below 500, in the error shape
when it is an error. Runs on whichever database the suite runs on (SQLite and PostgreSQL in
``make test``), with a bounded example count and its seed printed on failure.

``BOX_FUZZ_EXAMPLES`` raises the count; ``BOX_FUZZ_SEED`` repeats a run.
"""
from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from tests.conftest import Box, queue_through_the_cluster
from tests.factories import flow

SEED = int(os.environ.get("BOX_FUZZ_SEED") or random.randrange(2**32))
EXAMPLES = int(os.environ.get("BOX_FUZZ_EXAMPLES") or 200)
PARAM = re.compile(r"<(?:(\w+):)?(\w+)>")
SKIP = {"api/docs/"}  # an HTML page by design (Swagger UI)
# Field names the endpoints take, so bodies reach past the unknown-field check. Fields that name
# real directories (folder, folders, importFrom) are left out: the fuzzer must not copy `/`.
FIELDS = ["title", "prompt", "workspace", "worker", "command", "tools", "hosts", "budgetCents", "source", "flow",
          "facts", "secretFacts", "constraints", "limits", "externalTaskId", "externalAttempt", "steps", "run",
          "write", "path", "content", "name", "value", "version", "approve", "answer", "inputs", "cron", "timezone",
          "intervalSeconds", "template", "enabled", "kind", "secret", "pattern", "settleSeconds", "graceSeconds",
          "defaultBudgetCents", "networkDefault", "defaultHosts", "retentionDays", "maxActiveTasks",
          "canUseFolders", "code", "max_actions", "max_elapsed_ms", "payment", "origins", "events"]
QUERY = ["state", "source", "sort", "cursor", "limit", "after", "path", "status", "origin", "enabled", "kind", "paused"]
METHODS = ["GET", "POST", "PATCH", "PUT", "DELETE"]


def _endpoints(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, list[str]]]:
    """Every route and the methods its view answers."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _endpoints(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            view = getattr(pattern.callback, "cls", None) or getattr(pattern.callback, "view_class", None)
            methods = [m.upper() for m in METHODS if view is not None and hasattr(view, m.lower())]
            yield prefix + str(pattern.pattern), methods or ["POST"]


ENDPOINTS = sorted((route, methods) for route, methods in _endpoints(get_resolver().url_patterns)
                   if route.startswith(("api/", "hooks/")) and route not in SKIP)
API_ROUTES = [route for route, _ in ENDPOINTS]
CALLS = [(route, method) for route, methods in ENDPOINTS for method in methods]
# Valid bodies to start from, so a mutation of one field reaches past the first check.
VALID = [
    {"title": "t", "flow": {"steps": [{"write": {"path": "a.txt", "content": "a"}}, {"run": "cat a.txt", "save": "x"}]}},
    {"title": "t", "prompt": "p", "worker": "command", "command": "echo hi", "hosts": ["example.com"]},
    {"title": "t", "prompt": "p", "facts": {"a": "b"}, "secretFacts": ["a"], "limits": {"max_actions": 3}},
    {"name": "s", "intervalSeconds": 60, "template": {"title": "t", "prompt": "p"}},
    {"name": "s", "cron": "0 9 * * 1", "timezone": "Europe/Paris", "template": {"title": "t", "prompt": "p"}},
    {"name": "w", "kind": "webhook", "template": {"title": "t ${payload.x}", "prompt": "p"}},
    {"defaultBudgetCents": 5, "defaultHosts": ["example.com"], "maxActiveTasks": 50},
    {"name": "k", "value": "v"}, {"inputs": {"a": "b"}}, {"approve": True, "version": 1}, {"answer": "yes"},
    {"name": "a token"}, {"code": "123456", "name": "phone"},
]

texts = st.text(max_size=40)
numbers = st.one_of(st.integers(), st.integers(min_value=2**31 - 2, max_value=2**31 + 2), st.just(2**64),
                    st.floats(allow_nan=False, allow_infinity=False))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts, st.sampled_from(["", "\x00", "a'b\"c", "${x}", "/", "-1"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(FIELDS), texts), inner, max_size=4)), max_leaves=12)
mutated = st.builds(lambda base, changes: {**base, **changes}, st.sampled_from(VALID),
                    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=2))
bodies = st.one_of(mutated, mutated, st.sampled_from(VALID), st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
                   json_values)


@pytest.fixture
def fuzz_client(box: Box, settings: Any) -> tuple[APIClient, dict[str, list[str]]]:
    queue_through_the_cluster(settings)  # created tasks only need to exist
    task = box.create(title="t", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    schedule = box.api.post("/api/schedules", {"name": "s", "intervalSeconds": 60,
                                               "template": {"title": "t", "prompt": "p"}}).json()
    trigger = box.api.post("/api/triggers", {"name": "w", "kind": "webhook",
                                             "template": {"title": "t", "prompt": "p"}}).json()
    client = APIClient()  # a session: a fuzzed revoke cannot lock it out
    client.force_login(box.owner)
    known = {"task_id": [task["id"]], "schedule_id": [str(schedule["id"])], "trigger_id": [str(trigger["id"])],
             "token": [trigger["path"].rsplit("/", 1)[1]], "name": ["home", "a.txt"]}
    return client, known


def _path_value(kind: str | None, name: str, known: dict[str, list[str]]) -> st.SearchStrategy[str]:
    odd = st.sampled_from(["0", "-1", "99999999999999999999999", "%00", "%2e%2e", "a%2Fb", "tk0000"])
    if kind == "int":
        return st.one_of(st.integers(min_value=0, max_value=2**70).map(str), st.sampled_from(["1", "2"]))
    return st.one_of(st.sampled_from(known.get(name, ["1"])), odd, st.text(alphabet=st.characters(
        blacklist_categories=["Cs"], blacklist_characters="/?#"), min_size=1, max_size=20))


@settings(max_examples=EXAMPLES, deadline=None, print_blob=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@seed(SEED)
@given(data=st.data())
def test_no_request_to_any_endpoint_gets_a_5xx(fuzz_client: tuple[APIClient, dict[str, list[str]]], data: Any) -> None:
    client, known = fuzz_client
    route, method = data.draw(st.sampled_from(CALLS), label="call")
    if data.draw(st.integers(0, 9), label="odd method") == 0:
        method = data.draw(st.sampled_from(METHODS), label="method")
    path = "/" + PARAM.sub(lambda m: data.draw(_path_value(m.group(1), m.group(2), known), label=m.group(2)), route)
    query = data.draw(st.dictionaries(st.one_of(st.sampled_from(QUERY), texts), texts, max_size=3), label="query")
    body = data.draw(bodies, label="body") if method in ("POST", "PATCH", "PUT") else None
    response = client.generic(method, path, data=_json(body), content_type="application/json", QUERY_STRING=_qs(query))
    where = f"{method} {path} query={query!r} body={body!r} (BOX_FUZZ_SEED={SEED} repeats this run)"
    assert response.status_code < 500, f"{response.status_code} for {where}: {response.content[:300]!r}"
    if response.status_code >= 400 and response.status_code != 405 or response.status_code == 405 and path.startswith("/api"):
        assert "json" in response["Content-Type"], where
        error = response.json()
        assert {"code", "message", "field"} <= set(error), where


def _json(body: Any) -> str:
    return "" if body is None else json.dumps(body)


def _qs(query: dict[str, str]) -> str:
    return urlencode(query)


def test_the_fuzzer_covers_every_api_route_and_method() -> None:
    assert "api/tasks" in API_ROUTES and "hooks/<str:token>" in API_ROUTES and "api/pairing/claim" in API_ROUTES
    assert len(API_ROUTES) >= 40
    assert ("api/tasks", "POST") in CALLS and ("api/schedules/<str:schedule_id>", "PATCH") in CALLS
