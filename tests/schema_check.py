"""Every JSON answer the API gives a test is checked against the schema: the status must be one
the operation declares, and the body must validate against what it declares for that status. So
the schema is held not only to the representative calls of ``tests/api/test_schema.py`` but to
every response any test of the suite sees through Django's test client, or through a live
server whose handler is built while a test runs (the fuzzer's refusals, a hostile input's
error, every event kind a task's log shows). ``tests/conftest.py`` loads the fixture for the
whole suite. The ASGI application is built when ``boxsite.asgi`` is imported, before any test's
settings, so what a test sends through it directly (``tests/test_web_handler.py``) is not seen:
those tests assert their own answers.

It stays cheap: a test that makes no API call costs one middleware in the chain; the schema is
built once per test process, on the first check, and each (operation, status) gets one compiled
validator, kept for the process."""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from jsonschema import Draft202012Validator, FormatChecker

RECORDED: list[tuple[str, str, int, Any]] = []

# A timestamp the schema declares ``date-time`` must be one, with its offset (RFC 3339), unless
# a short secret of the task collided with its digits: the redaction masks it there too.
FORMATS = FormatChecker(formats=())


@FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    return not isinstance(value, str) or "${" in value or datetime.fromisoformat(value).tzinfo is not None


def _segment_for(template: str) -> Any:
    """{param} is one path segment, except an artifact's trailing {name} and a workspace file's
    {path}, which may hold slashes."""
    def segment(match: re.Match[str]) -> str:
        slashed = template.endswith(("/artifacts/{name}", "/files/{path}")) and template.endswith("{" + match.group(1) + "}")
        rest = ".+" if slashed else "[^/]+"
        return f"(?P<{match.group(1)}>{rest})"
    return segment


class Schema:
    """The schema document, and the operation a concrete path and method fall under."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.routes = [(re.compile("^" + re.sub(r"\{(\w+)\}", _segment_for(p), p) + "$"), p) for p in document["paths"]]
        self.validators: dict[tuple[str, str, str], Draft202012Validator] = {}

    def template_of(self, path: str) -> str:
        matches = [template for regex, template in self.routes if regex.match(path)]
        assert matches, f"{path} is not in the schema"
        return min(matches, key=lambda t: t.count("{"))  # a literal segment beats a parameter

    def operation(self, method: str, path: str) -> dict[str, Any]:
        item = self.document["paths"][self.template_of(path)]
        assert method.lower() in item, f"{method} {path} is not in the schema"
        return item[method.lower()]

    def check(self, method: str, path: str, status: int, body: Any) -> None:
        responses = self.operation(method, path)["responses"]
        assert str(status) in responses, f"{method} {path} answered {status}, which it does not declare"
        key = (method.lower(), self.template_of(path), str(status))
        if key not in self.validators:
            schema = responses[str(status)]["content"]["application/json"]["schema"]
            self.validators[key] = Draft202012Validator({**schema, "components": self.document["components"]},
                                                          format_checker=FORMATS)
        errors = sorted(self.validators[key].iter_errors(body), key=lambda e: list(e.path))
        assert not errors, f"{method} {path} {status}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])

    def declares(self, method: str, path: str) -> bool:
        templates = [template for regex, template in self.routes if regex.match(path)]
        if not templates:
            return False
        return method.lower() in self.document["paths"][min(templates, key=lambda t: t.count("{"))]


_schema: list[Schema] = []


def box_schema() -> Schema:
    """The schema as the box serves it, made once per test process."""
    if not _schema:
        document = SchemaGenerator().get_schema(request=None, public=True)
        _schema.append(Schema(json.loads(OpenApiJsonRenderer().render(document))))
    return _schema[0]


class RecordResponses:
    """Test-only middleware, outermost: what every API request answered, as the client sees it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (request.path.startswith("/api/") and not response.streaming
                and response.get("Content-Type", "").startswith("application/json")):
            try:
                body = json.loads(response.content)
            except ValueError:
                body = response.content  # not JSON although it says so: the check below fails on it
            RECORDED.append((request.method or "", request.path, response.status_code, body))
        return response


@pytest.fixture(autouse=True)
def responses_match_the_schema(settings: Any) -> Iterator[None]:
    settings.MIDDLEWARE = [f"{__name__}.RecordResponses", *settings.MIDDLEWARE]
    RECORDED.clear()
    yield
    if not RECORDED:
        return
    schema, problems = box_schema(), []
    for method, path, status, body in RECORDED:
        if path.startswith("/api/schema/") or not schema.declares(method, path):
            continue  # the schema itself; a route or method that is not an operation (404, 405)
        try:
            schema.check(method, path, status, body)
        except AssertionError as exc:
            problems.append(str(exc).splitlines()[0])
    RECORDED.clear()
    assert not problems, f"{len(problems)} responses the schema does not describe: " + "; ".join(sorted(set(problems))[:10])
