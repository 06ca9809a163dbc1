"""The task spec (docs/architecture.md#the-task-spec): checked whole before anything is created.

``parse_spec`` turns a request body into a ``TaskSpec`` or raises a ``BoxError`` naming the
problem. It creates nothing; the service creates the task only from a parsed spec.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from boxsite.errors import Forbidden, InvalidOutput, InvalidSpec, NotAvailable, OriginsRequired, OutputUnavailable
from boxsite.models import BoxSettings
from boxsite.principal import Principal
from boxsite.schema import TaskSpecBody
from boxsite.validation import check_fields, existing_dir, fields_of
from tasks.browser.binary import missing_reason as browser_missing_reason
from tasks.flows import schema_problem, uses_browser, validate_flow
from tasks.limits import DEFAULT_LIMITS, RESOURCE_DEFAULTS
from tasks.model import NoModel, current_config
from tasks.models import Workspace
from tasks.sandbox import cgroups
from tasks.sandbox.support import missing_reason
from tasks.tools import get_tool
from tasks.workers.presets import all_presets

MIN_MEMORY_MB = 16
MAX_RESCUES = 5  # the default is also the most a task may ask for
# Spec fields and limits the box will take once what they promise exists; until then a spec that
# sets them is refused (never stored and ignored). Each says why.
NOT_AVAILABLE_YET = {
    "dependsOn": "tasks do not wait for other tasks yet",
    "parent": "tasks have no parent-child cascade yet",
}
LIMITS_NOT_AVAILABLE_YET = {
    "disk_mb": "the box cannot yet bound what a task writes to its layer (see /api/health, isolation.limits)",
}
CONSTRAINTS_NOT_AVAILABLE_YET = {
    "surfaces": "the box has one surface (its browser) and no desktop to choose between",
    "browser_profile": "a profile kept across tasks would be a folder shared between task users; the box starts every browser with a fresh profile",
    "headed": "the box has no display: its browser runs headless",
    "browser_executable": "a task's browser is the box's own Chromium, the one its sandbox is built and tested for",
    "browser_endpoint": "attaching to a Chrome outside the task's sandbox would bypass its user, network and host list",
}


def resource_limits_unavailable() -> str | None:
    """Why this box cannot hold a task to its memory and CPU limits, or None when it can."""
    return missing_reason() or cgroups.unavailable()


MAX_WHOLE = 2**31 - 1  # the largest number an integer column holds on every database
MAX_FOLDERS = 10
BUILTIN_WORKERS = ("agent", "flow", "command")
PAYMENT_MODES = ("stop_at_payment", "fill_then_approve")
RESERVED_SOURCES = ("schedule:", "webhook:", "file:", "phone")

# The spec's fields are those ``boxsite.schema.TaskSpecBody`` declares: adding one is a line
# there, its check in ``parse_spec`` and the model field.
SPEC_FIELDS = fields_of(TaskSpecBody)
CONSTRAINT_FIELDS = {"payment", "origins", "allow_destructive", "surfaces", "browser_profile", "headed",
                     "browser_executable", "browser_endpoint"}

_HOST_RE = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*(:(?P<port>\d{1,5}))?$")


@dataclass
class TaskSpec:
    title: str
    prompt: str
    workspace: Any
    worker: str
    command: list[str] | None = None
    tools: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    budget_cents: int = 0
    source: str = "api"
    flow: dict[str, Any] | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    secret_facts: list[str] = field(default_factory=list)
    constraints: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    folders: list[str] = field(default_factory=list)
    external_task_id: str = ""
    external_attempt: int | None = None
    output: dict[str, Any] | None = None


def _str(body: dict[str, Any], key: str, *, required: bool = False, max_len: int = 100_000) -> str:
    value = body.get(key)
    if value is None:
        if required:
            raise InvalidSpec(f"'{key}' is required", field=key)
        return ""
    if not isinstance(value, str):
        raise InvalidSpec(f"'{key}' must be a string", field=key)
    if required and not value.strip():
        raise InvalidSpec(f"'{key}' must not be empty", field=key)
    if len(value) > max_len:
        raise InvalidSpec(f"'{key}' is longer than {max_len} characters", field=key)
    return value


def _refuse_overlapping(folders: list[str]) -> None:
    """Each folder once, none inside another (compared after resolving links): Keep writes each
    folder's changes on their own, so a path two folders share could be written twice, the
    second time through a link the first one planted."""
    for index, folder in enumerate(folders):
        for other in folders[:index]:
            if folder == other:
                raise InvalidSpec(f"folder '{folder}' is given twice", field="folders")
            inner, outer = (folder, other) if len(folder) > len(other) else (other, folder)
            if inner.startswith(outer.rstrip("/") + "/"):
                raise InvalidSpec(f"folder '{inner}' is inside folder '{outer}'; give one of them", field="folders")


def _str_list(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidSpec(f"'{key}' must be a list of non-empty strings", field=key)
    return list(dict.fromkeys(value))


def _int(value: Any, key: str, *, minimum: int = 0, maximum: int = MAX_WHOLE) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(f"'{key}' must be a whole number", field=key)
    if value < minimum:
        raise InvalidSpec(f"'{key}' must be at least {minimum}", field=key)
    if value > maximum:
        raise InvalidSpec(f"'{key}' must be at most {maximum}", field=key)
    return value


def valid_host(host: str) -> bool:
    """An allowlist entry: a host name, ``*.example.com``, or an IP address; a name may carry a
    port (1-65535)."""
    bare = host.lower()
    try:
        ipaddress.ip_address(bare.strip("[]"))
        return True
    except ValueError:
        pass
    if bare == "localhost":
        return True
    match = _HOST_RE.match(bare)
    if match is None or "." not in bare.lstrip("*."):
        return False
    port = match.group("port")
    return port is None or 1 <= int(port) <= 65535


def host_list(hosts: list[str]) -> list[str]:
    """Allowlist entries as stored: lower case, each once (case does not make a host new)."""
    return list(dict.fromkeys(h.lower() for h in hosts))


# The JSON Schema keywords an output schema may use: enough to describe a result's shape, and
# all of them checked by ``jsonschema``. Anything else (``$ref``, conditionals) is INVALID_OUTPUT.
OUTPUT_SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "items", "enum", "const", "description", "title", "additionalProperties",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "minLength", "maxLength",
    "pattern", "format", "anyOf", "default", "examples", "$schema",
})


def _unsupported_keyword(schema: Any, where: str) -> str | None:
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"{where} is not a schema object"
    for key, value in schema.items():
        if key not in OUTPUT_SCHEMA_KEYWORDS:
            return f"'{key}' at {where} is outside the supported subset ({', '.join(sorted(OUTPUT_SCHEMA_KEYWORDS))})"
        if key == "properties" and isinstance(value, dict):
            for name, inner in value.items():
                if (problem := _unsupported_keyword(inner, f"{where}.properties.{name}")) is not None:
                    return problem
        elif key in ("items", "additionalProperties") and isinstance(value, (dict, bool)):
            if (problem := _unsupported_keyword(value, f"{where}.{key}")) is not None:
                return problem
        elif key == "anyOf" and isinstance(value, list):
            for i, inner in enumerate(value):
                if (problem := _unsupported_keyword(inner, f"{where}.anyOf[{i}]")) is not None:
                    return problem
    return None


def parse_output(value: Any) -> dict[str, Any]:
    """``output: {instructions, schema?}``: the answer the caller wants, shaped by the model from
    what the task saved. ``INVALID_OUTPUT`` for a schema outside the supported subset,
    ``OUTPUT_UNAVAILABLE`` when no model is configured to shape it."""
    if not isinstance(value, dict):
        raise InvalidOutput("'output' is an object with 'instructions' and an optional 'schema'", field="output")
    unknown = sorted(set(value) - {"instructions", "schema"})
    if unknown:
        raise InvalidOutput(f"unknown field '{unknown[0]}' in 'output'", field=f"output.{unknown[0]}")
    instructions = value.get("instructions")
    if not isinstance(instructions, str) or not instructions.strip() or len(instructions) > 10_000:
        raise InvalidOutput("'output.instructions' must be a non-empty string (at most 10000 characters)", field="output.instructions")
    if "schema" in value:
        schema = value["schema"]
        problem = schema_problem(schema) or _unsupported_keyword(schema, "schema")
        if problem:
            raise InvalidOutput(f"'output.schema' cannot be used: {problem}", field="output.schema")
    try:
        current_config()
    except NoModel as exc:
        raise OutputUnavailable(f"'output' needs a model to shape the answer: {exc}", field="output") from exc
    return dict(value)


def parse_spec(body: Any, principal: Principal, *, source: str | None = None) -> TaskSpec:
    """Check a whole spec. ``source`` is set by the box's own channels (schedules, the phone)."""

    if not isinstance(body, dict):
        raise InvalidSpec("a task spec is a JSON object")
    later = sorted(set(body) & set(NOT_AVAILABLE_YET))
    if later:
        raise NotAvailable(f"'{later[0]}' is not available yet: {NOT_AVAILABLE_YET[later[0]]}", field=later[0])
    check_fields(body, SPEC_FIELDS, error=InvalidSpec, hints={"budget": "budgetCents"}, what="a task spec")

    title = _str(body, "title", required=True, max_len=200)
    flow = body.get("flow")
    if flow is not None:
        validate_flow(flow)
        browser_missing = browser_missing_reason() if uses_browser(flow) else None
        if browser_missing is not None:
            raise NotAvailable(f"browser steps cannot run on this box: {browser_missing}", field="flow")
    prompt = _str(body, "prompt", required=flow is None)

    presets = all_presets()
    worker = _str(body, "worker") or ("flow" if flow is not None else "agent")
    if worker not in BUILTIN_WORKERS and worker not in presets:
        raise InvalidSpec(f"unknown worker '{worker}'", field="worker")
    if worker != "flow" and flow is not None:
        raise InvalidSpec(f"'flow' is only for the flow worker, not '{worker}'", field="flow")
    command: list[str] | None = None
    if "command" in body:
        if worker != "command":
            raise InvalidSpec("'command' is only for the command worker", field="command")
        raw = body["command"]
        if isinstance(raw, str):
            try:
                command = shlex.split(raw)
            except ValueError as exc:  # an unbalanced quote
                raise InvalidSpec(f"'command' cannot be split into arguments: {exc}", field="command") from exc
        elif isinstance(raw, list) and all(isinstance(a, str) for a in raw):
            command = list(raw)
        else:
            raise InvalidSpec("'command' must be a string or a list of strings", field="command")
        if not command:
            raise InvalidSpec("'command' must not be empty", field="command")
    elif worker == "command":
        raise InvalidSpec("the command worker needs a 'command'", field="command")

    tools = _str_list(body, "tools")
    for name in tools:
        if get_tool(name) is None:
            raise InvalidSpec(f"unknown tool '{name}': no installed app provides it", field="tools")

    box_settings = BoxSettings.current()
    if "hosts" in body:
        hosts = _str_list(body, "hosts")
    elif box_settings.network_default == "allowlist":
        hosts = list(box_settings.default_hosts)
    else:
        hosts = []
    for host in hosts:
        if not valid_host(host):
            raise InvalidSpec(f"'{host}' is not a host name, '*.domain' or an IP address", field="hosts")
    hosts = host_list(hosts)

    budget = _int(body["budgetCents"], "budgetCents") if "budgetCents" in body else box_settings.default_budget_cents

    if source is None:
        source = _str(body, "source", max_len=200) or "api"
        if source.startswith(RESERVED_SOURCES):
            raise InvalidSpec(f"source '{source}' is reserved for the box's own channels", field="source")

    facts = body.get("facts", {})
    if not isinstance(facts, dict) or not all(isinstance(v, (str, int, float, bool)) or v is None for v in facts.values()):
        raise InvalidSpec("'facts' must be an object of plain values", field="facts")
    facts = {k: ("" if v is None else str(v) if not isinstance(v, str) else v) for k, v in facts.items()}
    secret_facts = _str_list(body, "secretFacts")

    constraints = body.get("constraints", {})
    if not isinstance(constraints, dict):
        raise InvalidSpec("'constraints' must be an object", field="constraints")
    unknown_c = sorted(set(constraints) - CONSTRAINT_FIELDS)
    if unknown_c:
        raise InvalidSpec(f"unknown constraint '{unknown_c[0]}'", field=f"constraints.{unknown_c[0]}")
    later_c = sorted(set(constraints) & set(CONSTRAINTS_NOT_AVAILABLE_YET))
    if later_c:
        name = later_c[0]
        raise NotAvailable(f"'constraints.{name}' is not available yet: {CONSTRAINTS_NOT_AVAILABLE_YET[name]}", field=f"constraints.{name}")
    payment = constraints.get("payment", "stop_at_payment")
    if payment not in PAYMENT_MODES:
        raise InvalidSpec(f"'constraints.payment' must be one of {', '.join(PAYMENT_MODES)}", field="constraints.payment")
    origins = constraints.get("origins", [])
    if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
        raise InvalidSpec("'constraints.origins' must be a list of strings", field="constraints.origins")
    if payment == "fill_then_approve" and not origins:
        raise OriginsRequired("payment mode fill_then_approve needs 'constraints.origins': the sites card details may be typed on", field="constraints.origins")
    if "allow_destructive" in constraints and not isinstance(constraints["allow_destructive"], bool):
        raise InvalidSpec("'constraints.allow_destructive' must be true or false", field="constraints.allow_destructive")
    profile = constraints.get("browser_profile")
    if profile is not None and (not isinstance(profile, str) or not os.path.isabs(profile)):
        raise InvalidSpec("'constraints.browser_profile' must be an absolute path", field="constraints.browser_profile", code="INVALID_REQUEST")

    limits_in = body.get("limits", {})
    if not isinstance(limits_in, dict):
        raise InvalidSpec("'limits' must be an object", field="limits")
    limits: dict[str, int] = {}
    for key, value in limits_in.items():
        if key in LIMITS_NOT_AVAILABLE_YET:
            raise NotAvailable(f"'limits.{key}' is not available yet: {LIMITS_NOT_AVAILABLE_YET[key]}", field=f"limits.{key}")
        if key not in DEFAULT_LIMITS:
            raise InvalidSpec(f"unknown limit '{key}'", field=f"limits.{key}")
        limits[key] = _int(value, f"limits.{key}", minimum=MIN_MEMORY_MB if key == "memory_mb" else 0 if key == "max_rescues" else 1,
                           maximum=MAX_RESCUES if key == "max_rescues" else MAX_WHOLE)
        if key in RESOURCE_DEFAULTS and (unenforced := resource_limits_unavailable()) is not None:
            raise NotAvailable(f"'limits.{key}' cannot be enforced on this box: {unenforced}", field=f"limits.{key}")
    if resource_limits_unavailable() is None:
        for name in RESOURCE_DEFAULTS:  # the owner's defaults at creation, like the budget
            limits.setdefault(name, box_settings.resource_default(name))
    cores = os.cpu_count() or 1
    if limits.get("cpu_percent", 0) > 100 * cores:
        raise InvalidSpec(f"'limits.cpu_percent' is at most {100 * cores} (all {cores} cores)", field="limits.cpu_percent")

    folders: list[str] = []
    if "folder" in body and "folders" in body:
        raise InvalidSpec("give 'folder' or 'folders', not both", field="folders")
    if "folder" in body:
        folders = [_str(body, "folder", required=True)]
    elif "folders" in body:
        folders = _str_list(body, "folders")
        if len(folders) != len(body["folders"]):
            raise InvalidSpec("a folder is given twice", field="folders")
    if folders:
        if not principal.can_use_folders:
            raise Forbidden("only the owner can hand out folders", field="folders")
        if len(folders) > MAX_FOLDERS:
            raise InvalidSpec(f"at most {MAX_FOLDERS} folders", field="folders")
        folders = [existing_dir(path, "folders", error=InvalidSpec) for path in folders]
        _refuse_overlapping(folders)
        if "workspace" in body:
            raise InvalidSpec("a folder task works on folders, not a workspace", field="workspace")

    workspace_name = _str(body, "workspace") or "home"
    workspace = Workspace.objects.filter(name=workspace_name).first()
    if workspace is None:
        raise InvalidSpec(f"unknown workspace '{workspace_name}'", field="workspace")

    attempt = body.get("externalAttempt")
    if attempt is not None:
        attempt = _int(attempt, "externalAttempt")

    output = parse_output(body["output"]) if "output" in body else None

    return TaskSpec(
        output=output,
        title=title.strip(), prompt=prompt, workspace=workspace, worker=worker, command=command,
        tools=tools, hosts=hosts, budget_cents=budget, source=source, flow=flow, facts=facts,
        secret_facts=secret_facts, constraints=constraints, limits=limits, folders=folders,
        external_task_id=_str(body, "externalTaskId", max_len=200), external_attempt=attempt,
    )
