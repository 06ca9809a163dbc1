"""The task spec (docs/internals/task-lifecycle.md#the-task-spec): checked whole before anything is created.

``TaskSpecBody`` declares the spec: each field, its check, and (through drf-spectacular) its
schema. ``parse_spec`` turns a request body into a ``TaskSpec`` (the values of the task's model
fields) or raises a ``BoxError`` naming the problem. It creates nothing; the service creates the
task only from a parsed spec. Adding a field: docs/internals/task-lifecycle.md#adding-a-field-to-the-task-spec.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shlex
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema_field

from boxsite.core.errors import (
    BoxError,
    Conflict,
    Forbidden,
    InvalidFlow,
    InvalidOutput,
    InvalidRequest,
    InvalidSpec,
    NotAvailable,
    OriginsRequired,
    OutputUnavailable,
)
from boxsite.core.principal import Principal
from boxsite.core.validation import (
    MISSING,
    AnyText,
    Anything,
    Body,
    Choice,
    Flag,
    Names,
    Obj,
    Plain,
    Problem,
    Text,
    Whole,
    existing_dir,
)
from boxsite.models import BoxSettings
from tasks.browser.binary import DEBIAN_WRAPPER as BOX_BROWSER_WRAPPER
from tasks.browser.binary import executable as browser_executable
from tasks.browser.binary import missing_reason as browser_missing_reason
from tasks.dependencies import parse_edges
from tasks.layers import disk
from tasks.llm.client import NoModel, current_config
from tasks.models import Task, VaultSecret, Workspace
from tasks.run.completion import parse_criteria
from tasks.sandbox import cgroups, paths
from tasks.sandbox.support import missing_reason
from tasks.spec.describe import flow_schema
from tasks.spec.flows import check_memory as check_hints
from tasks.spec.flows import schema_problem, uses_browser, validate_flow
from tasks.states import ACTIVE
from tasks.tools.registry import get_tool
from tasks.vault.store import NAME_RE
from tasks.workers.presets import all_presets

MIN_SIZE_MB = 16  # memory_mb and disk_mb
MAX_RESCUES = 5  # the default is also the most a task may ask for
MAX_FOLDERS = 10
BUILTIN_WORKERS = ("agent", "flow", "command")
PAYMENT_MODES = ["stop_at_payment", "fill_then_approve"]
RESERVED_SOURCES = ("schedule:", "webhook:", "file:", "phone", "task:", "recovery:")

_HOST_RE = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*(:(?P<port>\d{1,5}))?$")


def resource_limits_unavailable(name: str = "memory_mb") -> str | None:
    """Why this box cannot hold a task to its resource limit ``name`` (memory and CPU: cgroups;
    disk: an image per task, ``tasks.layers.disk``), or None when it can."""
    return missing_reason() or (disk.unavailable() if name == "disk_mb" else cgroups.unavailable())


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


class ConstraintsBody(Body):
    """``constraints``: how a task may act on the world."""

    error = InvalidSpec
    prefix = "constraints."
    what = "'constraints'"
    not_object = "{what} must be an object"
    unknown = "unknown constraint '{name}'"
    later: ClassVar[dict[str, str]] = {
        "surfaces": "the box has one surface (its browser) and no desktop to choose between",
        "browser_endpoint": "attaching to a Chrome outside the task's sandbox would bypass its user, network and host list",
    }

    payment = Choice(PAYMENT_MODES, required=False, help_text="default stop_at_payment")
    origins = Names(required=False, dedupe=False, blank_ok=True, invalid="'{name}' must be a list of strings",
                    help_text="the sites card details may be typed on (fill_then_approve)")
    allow_destructive = Flag(required=False, help_text="true: steps with stop_before, irreversible tools and the agent's "
                                                       "HTTP requests other than GET/HEAD go without asking")
    browser_profile = Text(required=False, help_text="an absolute folder of the owner's the task's browser keeps its "
                                                     "profile in, across tasks (one running browser per profile)")
    headed = Flag(required=False, help_text="false only: the box has no display, its browser runs headless")
    browser_executable = Text(required=False, help_text="the box's own Chromium only (its path, or Debian's /usr/bin/chromium)")

    def check_browser_profile(self, value: Any, seen: dict[str, Any]) -> Any:
        """A folder of the owner's the task's browser keeps its profile in (cookies, storage),
        by the rules of ``folders``: owner only, an existing absolute directory, not the box's."""
        if value is MISSING:
            return value
        principal = self.context.get("principal")
        if principal is None or not principal.can_use_folders:
            raise Forbidden("only the owner can give a browser profile folder", field="constraints.browser_profile")
        real = existing_dir(value, "constraints.browser_profile", error=InvalidSpec)
        data = os.path.realpath(paths.data_dir())
        if real == "/" or real == data or real.startswith(data + "/") or data.startswith(real + "/"):
            raise InvalidSpec(f"'{value}' is the box's own directory or holds it; give a folder of its own",
                              field="constraints.browser_profile")
        return real

    def check_headed(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is True:
            raise NotAvailable("'constraints.headed' cannot be true on this box: it has no display, so its browser "
                               "runs headless", field="constraints.headed")
        return value

    def check_browser_executable(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            return value
        if not os.path.isabs(value):
            raise Problem(f"'{value}' is not an absolute path")
        own = browser_executable()
        if os.path.realpath(value) not in (os.path.realpath(own), os.path.realpath(BOX_BROWSER_WRAPPER)):
            raise NotAvailable(f"'constraints.browser_executable' can only be the box's own Chromium ({own}): a task's "
                               "browser runs inside its sandbox, which is built and tested for that binary alone",
                               field="constraints.browser_executable")
        return value

    def check_origins(self, value: Any, seen: dict[str, Any]) -> Any:
        if seen.get("payment") == "fill_then_approve" and not value:
            raise OriginsRequired("payment mode fill_then_approve needs 'constraints.origins': the sites card details "
                                  "may be typed on", field="constraints.origins")
        return value


class LimitsBody(Body):
    """``limits``: what a task may use; the box stops it at the first it reaches."""

    error: ClassVar[type[BoxError]] = InvalidSpec
    prefix = "limits."
    what = "'limits'"
    not_object = "{what} must be an object"
    unknown = "unknown limit '{name}'"
    later: ClassVar[dict[str, str]] = {}

    max_actions = Whole(required=False, min_value=1, help_text="tool calls and steps")
    max_model_calls = Whole(required=False, min_value=1, help_text="calls to the model")
    max_rescues = Whole(required=False, min_value=0, max_value=MAX_RESCUES, help_text="times the model may rescue a failed step")
    max_elapsed_ms = Whole(required=False, min_value=1, help_text="running time (not time waiting for a person)")
    memory_mb = Whole(required=False, min_value=MIN_SIZE_MB, help_text="default: the owner's setting")
    cpu_percent = Whole(required=False, min_value=1, help_text="100 is one core; default: the owner's setting")
    disk_mb = Whole(required=False, min_value=MIN_SIZE_MB, help_text="what the task may write to its layer; default: the owner's setting")

    def _resource(self, name: str, value: Any) -> Any:
        unenforced = resource_limits_unavailable(name)
        if value is not MISSING and unenforced is not None:
            raise NotAvailable(f"'limits.{name}' cannot be enforced on this box: {unenforced}", field=f"limits.{name}")
        if value is MISSING and unenforced is None:  # the owner's default at creation, like the budget
            return BoxSettings.current().resource_default(name) or MISSING  # 0: no default (disk_mb)
        return value

    def check_disk_mb(self, value: Any, seen: dict[str, Any]) -> Any:
        return self._resource("disk_mb", value)

    def check_memory_mb(self, value: Any, seen: dict[str, Any]) -> Any:
        return self._resource("memory_mb", value)

    def check_cpu_percent(self, value: Any, seen: dict[str, Any]) -> Any:
        value = self._resource("cpu_percent", value)
        cores = os.cpu_count() or 1
        if value is not MISSING and value > 100 * cores:
            raise Problem(f"'limits.cpu_percent' is at most {100 * cores} (all {cores} cores)")
        return value


@extend_schema_field(flow_schema())
class FlowField(Obj):
    """A flow: declared to callers as the flow language (one schema per step kind), checked by
    ``tasks.spec.flows.validate_flow``."""


class TaskSpecBody(Body):
    """A task spec, as ``POST /api/tasks`` takes it."""

    # Fields are checked in this order; each ``check_<field>`` below adds what needs the fields
    # before it, the asker or the box.
    error = InvalidSpec
    what = "a task spec"
    not_object = "a task spec is a JSON object"
    hints: ClassVar[dict[str, str]] = {"budget": "budgetCents"}
    later: ClassVar[dict[str, str]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dependencies: dict[str, Task] = {}  # what ``check_dependsOn`` read, for the creation to reuse

    title = Text(max_length=200)
    flow = FlowField(required=False, help_text="{\"steps\": [...]} (flow worker)")
    memory = Anything(required=False, help_text="grounding hints from an earlier run's report "
                                                "([{instruction, page, selector}]); joins the flow's 'memory'")
    trace = Flag(required=False, help_text="true: record every model exchange of the flow's grounding whole")
    prompt = Text(required=False, help_text="required unless 'flow' is given")
    worker = Text(required=False, help_text="agent, flow, command, or a preset")
    command = Anything(required=False, help_text="a string or a list of strings (command worker)")
    tools = Names(required=False)
    hosts = Names(required=False, help_text="the network allowlist; default: the owner's, when the default is allowlist")
    budgetCents = Whole(required=False, source="budget_cents", help_text="default: the owner's setting")
    source = Text(required=False, max_length=200)  # type: ignore[assignment]  # a body field, not Field.source
    facts = Plain(required=False, help_text="name: value, for ${name} in steps")
    secretFacts = Names(required=False, source="secret_facts", help_text="facts whose values are secret")
    vaultSecrets = Names(required=False, source="vault_secrets",
                         help_text="vault secrets the task may use as ${NAME}, like secret facts (the model sees the name only)")
    constraints = ConstraintsBody(required=False)
    limits = LimitsBody(required=False)
    folder = Text(required=False, source="folders", help_text="one folder to work on (owner only)")
    folders = Names(required=False, dedupe=False, help_text="absolute directories to work on (owner only)")
    workspace = Text(required=False, help_text="default home; not with folders")
    externalAttempt = Whole(required=False, allow_null=True, source="external_attempt")
    externalTaskId = Text(required=False, max_length=200, source="external_task_id")
    output = Obj(required=False, help_text="{\"instructions\": \"...\", \"schema\": {...}}: the answer shaped by the model")
    dependsOn = Anything(required=False, source="depends_on",
                         help_text="task ids, or {task, condition: success|completion|artifact, required, artifact} "
                                   "objects: the task starts only once these allow it")
    parent = AnyText(required=False, allow_null=True,  # type: ignore[assignment]  # a body field, not Field.parent
                     help_text="a task that has not ended: cancelling it cancels this one too")
    criteria = Anything(required=False, allow_null=True,
                        help_text="the completion contract: {kind: output_file, path: outputs/…, size?, sha256?, "
                                  "mediaType?, contains?, json?} and {kind: command_exit, command, exitCode}")
    notify = Anything(required=False, allow_null=True,
                      help_text="{\"done\": true}: tell the owner when the task is done, besides its waits and failures")

    def check_title(self, value: Any, seen: dict[str, Any]) -> Any:
        return value.strip()

    def check_flow(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING or value is None:
            return None
        validate_flow(value)
        browser_missing = browser_missing_reason() if uses_browser(value) else None
        if browser_missing is not None:
            raise NotAvailable(f"browser steps cannot run on this box: {browser_missing}", field="flow")
        return value

    def check_memory(self, value: Any, seen: dict[str, Any]) -> Any:
        """Top-level ``memory``/``trace`` (as in the seed's StartTask) join the flow they are for."""
        return self._into_flow("memory", value, seen)

    def check_trace(self, value: Any, seen: dict[str, Any]) -> Any:
        return self._into_flow("trace", value, seen)

    def _into_flow(self, name: str, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            return MISSING
        try:
            check_hints({name: value}, "")
        except InvalidFlow as exc:
            raise Problem(exc.message) from None
        flow = seen.get("flow")
        if flow is None:
            raise NotAvailable(f"'{name}' is for a flow's browser steps: give it with 'flow' (a plain-language "
                               "task's flow is written by its planner, which takes no grounding hints)", field=name)
        if name == "memory":
            flow["memory"] = [*flow.get("memory", []), *value]
        else:
            flow["trace"] = bool(flow.get("trace")) or value
        return MISSING

    def check_prompt(self, value: Any, seen: dict[str, Any]) -> Any:
        if seen["flow"] is None:
            if self.given.get("prompt") is None:
                raise Problem("'prompt' is required")
            if not value.strip():
                raise Problem("'prompt' must not be empty")
        return "" if value is MISSING else value

    def check_worker(self, value: Any, seen: dict[str, Any]) -> Any:
        flow = seen["flow"] is not None
        worker = value or ("flow" if flow else "agent")
        if worker not in BUILTIN_WORKERS and worker not in all_presets():
            raise Problem(f"unknown worker '{worker}'")
        if worker != "flow" and flow:
            raise InvalidSpec(f"'flow' is only for the flow worker, not '{worker}'", field="flow")
        return worker

    def check_command(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            if seen["worker"] == "command":
                raise Problem("the command worker needs a 'command'")
            return None
        if seen["worker"] != "command":
            raise Problem("'command' is only for the command worker")
        if isinstance(value, str):
            try:
                command = shlex.split(value)
            except ValueError as exc:  # an unbalanced quote
                raise Problem(f"'command' cannot be split into arguments: {exc}") from exc
        elif isinstance(value, list) and all(isinstance(a, str) for a in value):
            command = list(value)
        else:
            raise Problem("'command' must be a string or a list of strings")
        if not command:
            raise Problem("'command' must not be empty")
        return command

    def check_tools(self, value: Any, seen: dict[str, Any]) -> Any:
        value = value or []
        for name in value:
            if get_tool(name) is None:
                raise Problem(f"unknown tool '{name}': no installed app provides it")
        return value

    def check_hosts(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            box_settings = BoxSettings.current()
            value = list(box_settings.default_hosts) if box_settings.network_default == "allowlist" else []
        for host in value:
            if not valid_host(host):
                raise Problem(f"'{host}' is not a host name, '*.domain' or an IP address")
        return host_list(value)

    def check_budgetCents(self, value: Any, seen: dict[str, Any]) -> Any:
        return BoxSettings.current().default_budget_cents if value is MISSING else value

    def check_source(self, value: Any, seen: dict[str, Any]) -> Any:
        channel = self.context.get("source")
        if channel is not None:  # set by the box's own channels (schedules, the phone)
            return channel
        source = value or "api"
        if source.startswith(RESERVED_SOURCES):
            raise Problem(f"source '{source}' is reserved for the box's own channels")
        return source

    def check_facts(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            return {}
        return {k: ("" if v is None else str(v) if not isinstance(v, str) else v) for k, v in value.items()}

    def check_secretFacts(self, value: Any, seen: dict[str, Any]) -> Any:
        return value or []

    def check_vaultSecrets(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            return []
        held = set(VaultSecret.objects.filter(name__in=value).values_list("name", flat=True))
        for name in value:
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise InvalidSpec(f"'{name}' is not a vault name (letters, digits and _)", field="vaultSecrets")
            if name not in held:
                raise InvalidSpec(f"the vault has no '{name}'; add it in Settings → Vault (POST /api/vault) first",
                                  field="vaultSecrets")
        return value

    def check_constraints(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            return {}
        constraints = dict(self.given["constraints"])
        if "browser_profile" in value:
            constraints["browser_profile"] = value["browser_profile"]  # its real path
        return constraints

    def check_limits(self, value: Any, seen: dict[str, Any]) -> Any:
        return LimitsBody(context=self.context).check_all({}) if value is MISSING else value

    def check_folder(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is not MISSING and "folders" in self.given:
            raise InvalidSpec("give 'folder' or 'folders', not both", field="folders")
        if value is not MISSING and not value.strip():
            raise Problem("'folder' must not be empty")
        return MISSING if value is MISSING else self._folders([value])

    def check_folders(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            return seen.pop("folder", [])
        if len(set(value)) != len(value):
            raise Problem("a folder is given twice")
        return self._folders(value)

    def _folders(self, folders: list[str]) -> list[str]:
        principal: Principal = self.context["principal"]
        if not folders:
            return []
        if not principal.can_use_folders:
            raise Forbidden("only the owner can hand out folders", field="folders")
        if len(folders) > MAX_FOLDERS:
            raise InvalidSpec(f"at most {MAX_FOLDERS} folders", field="folders")
        real = [existing_dir(path, "folders", error=InvalidSpec) for path in folders]
        _refuse_overlapping(real)
        if "workspace" in self.given:
            raise InvalidSpec("a folder task works on folders, not a workspace", field="workspace")
        return real

    def check_workspace(self, value: Any, seen: dict[str, Any]) -> Any:
        name = value or "home"
        try:  # the name is unique: get() asks for no ordering (first() would sort by id)
            return Workspace.objects.get(name=name)
        except Workspace.DoesNotExist:
            raise Problem(f"unknown workspace '{name}'") from None

    def check_externalTaskId(self, value: Any, seen: dict[str, Any]) -> Any:
        return "" if value is MISSING else value

    def check_output(self, value: Any, seen: dict[str, Any]) -> Any:
        return None if value is MISSING else parse_output(value)

    def check_dependsOn(self, value: Any, seen: dict[str, Any]) -> Any:
        """The edges as stored (``Task.depends_on``); each named task must be the caller's."""
        if value is MISSING:
            return []
        edges = parse_edges(value)
        for edge in edges:
            self.dependencies[edge.on] = _reachable_task(self.context["principal"], edge.on, "dependsOn")
        return [edge.as_json() for edge in edges]

    def check_parent(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING or value is None:
            return None
        if not isinstance(value, str) or not value or len(value) > 24:
            raise Problem("'parent' must be a task id")
        parent = _reachable_task(self.context["principal"], value, "parent")
        if parent.state not in ACTIVE:
            raise Conflict(f"the parent '{parent.pk}' is {parent.state}; a child needs a parent that has not ended",
                           field="parent", state=parent.state)
        return parent

    def check_criteria(self, value: Any, seen: dict[str, Any]) -> Any:
        return None if value is MISSING or value is None else parse_criteria(value)

    def check_notify(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING or value is None:
            return {}
        if not isinstance(value, dict) or set(value) - {"done"} or not all(isinstance(v, bool) for v in value.values()):
            raise Problem("'notify' must be {\"done\": true|false}: whether to tell the owner when the task is done")
        return {"done": True} if value.get("done") else {}


def _reachable_task(principal: Principal, task_id: str, field: str) -> Task:
    """A task the caller may reach, named in a spec; another's task is as unknown as none. Only
    what a spec's checks and its edges use is read (the whole row, its JSON decoded, would be a
    large part of a dependent's creation); any other field is read when first used."""
    try:
        return Task.objects.reachable_by(principal).only("id", "owner_id", "state").get(pk=task_id)
    except Task.DoesNotExist:
        raise InvalidSpec(f"no task '{task_id}'", field=field) from None


class RerunBody(TaskSpecBody):
    """``POST /api/tasks/<id>/rerun``: any spec field, each replacing the ended task's."""

    title = Text(max_length=200, required=False, help_text="every field optional: it replaces the ended task's")


class RaisedLimitsBody(LimitsBody):
    """``limits`` of a retry: only the limits given, each checked as in a spec (no defaults
    added). Whether each raises the limit in force is the service's check (it needs the task)."""

    error = InvalidRequest

    def _resource(self, name: str, value: Any) -> Any:
        unenforced = resource_limits_unavailable(name)
        if value is not MISSING and unenforced is not None:
            raise NotAvailable(f"'limits.{name}' cannot be enforced on this box: {unenforced}", field=f"limits.{name}")
        return value


class RetryBody(Body):
    """``POST /api/tasks/<id>/retry``: what to raise before a recoverable failure goes on. Every
    field optional; a value may raise a limit or the budget, never lower it."""

    hints: ClassVar[dict[str, str]] = {"budget": "budgetCents"}

    limits = RaisedLimitsBody(required=False, help_text="limits to raise (the names a spec's 'limits' takes)")
    budgetCents = Whole(required=False, source="budget_cents", help_text="a budget at least the current one")
    version = Whole(required=False, invalid="'version' is the task version you saw (a whole number)",
                    help_text="the task version you saw; another is a 409")


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


@dataclass
class TaskSpec:
    """A checked spec: the values of the task's model fields, by their model names, and the
    tasks its ``dependsOn`` names, by id, as the check read them."""

    fields: dict[str, Any]
    dependencies: dict[str, Task] = dataclass_field(default_factory=dict)


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


SPEC_FIELDS = TaskSpecBody.names()


def parse_spec(body: Any, principal: Principal, *, source: str | None = None) -> TaskSpec:
    """Check a whole spec. ``source`` is set by the box's own channels (schedules, the phone)."""
    declared = TaskSpecBody(context={"principal": principal, "source": source})
    return TaskSpec(declared.model_values(declared.check_all(body)), declared.dependencies)

