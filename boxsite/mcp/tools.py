"""What an MCP client may call. Each tool checks its arguments with a declared ``Body`` (whose
fields are also the tool's ``inputSchema``), makes the one service call the API's view makes,
and answers what the API's presenter returns for it. Access is the caller's ``Principal``, as
in the API: a paired phone reaches what it reaches there.

Long work is never waited for: ``create_task`` answers at once with the task (its ``id`` and
``state``), and a client follows it with ``get_task`` until ``final``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from drf_spectacular.drainage import get_override
from rest_framework import serializers

from approvals import services as approvals
from approvals.services import ContinueBody
from boxsite.core.principal import Principal
from boxsite.core.validation import (
    AnyNumber,
    AnyText,
    Anything,
    AnyWhole,
    Body,
    Choice,
    Flag,
    Names,
    Number,
    Obj,
    Text,
    Whole,
)
from tasks import services, verbs
from tasks.api.presenters import detail_sections, present_task
from tasks.api.views import EVENT_PAGE, channel_source, events_after, task_page
from tasks.api.workspaces import browse_of, diff_of, workspace_page
from tasks.layers import workspaces
from tasks.spec.task import TaskSpecBody
from tasks.states import State

TASK_ID = "the task's id (as create_task and list_tasks answer it)"


class Arguments(Body):
    what = "the arguments"
    not_object = "the arguments must be a JSON object"
    unknown = "unknown argument '{name}'"


class NoArguments(Arguments):
    pass


class TaskArguments(Arguments):
    task = Text(help_text=TASK_ID, max_length=200)


class ListArguments(Arguments):
    state = Text(required=False, max_length=500, help_text=f"only these states, comma-separated: {', '.join(State.values)}")
    source = Text(required=False, max_length=200,  # type: ignore[assignment]  # an argument, not Field.source
                  help_text="only tasks from this source (api, mcp, phone, portal, schedule, ...)")
    q = Text(required=False, max_length=200, help_text="every word in the title or the prompt")
    sort = Choice(["-created", "created", "-updated"], required=False, help_text="newest first by default")
    cursor = Text(required=False, max_length=500, help_text="the 'next' of the previous page")
    limit = Whole(required=False, min_value=1, max_value=200, help_text="at most this many (default 50)")


class LogArguments(TaskArguments):
    after = Whole(required=False, help_text="only events after this seq (the previous page's nextAfter); default 0")
    limit = Whole(required=False, min_value=1, max_value=1000, help_text=f"at most this many (default {EVENT_PAGE})")


class ContinueArguments(ContinueBody):
    what = "the arguments"
    unknown = "unknown argument '{name}'"
    task = Text(help_text=TASK_ID, max_length=200)


class FilesArguments(Arguments):
    workspace = Text(max_length=64, help_text="the workspace's name (list_workspaces)")
    path = Text(required=False, max_length=4096, help_text="a folder or a file, relative to the workspace root; default the root")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    arguments: type[Body]
    run: Callable[[Principal, dict[str, Any]], Mapping[str, Any]]
    read_only: bool = True

    def listed(self) -> dict[str, Any]:
        """The tool as ``tools/list`` describes it."""
        return {"name": self.name, "description": self.description, "inputSchema": input_schema(self.arguments),
                "annotations": {"readOnlyHint": self.read_only, "openWorldHint": False}}


def input_schema(body: type[Body]) -> dict[str, Any]:
    """The JSON Schema of ``body``'s declared fields (the same declaration that checks them)."""
    fields = body().fields
    schema: dict[str, Any] = {"type": "object", "properties": {name: _field_schema(f) for name, f in fields.items()},
                              "additionalProperties": False}
    required = [name for name, field in fields.items() if field.required]
    if required:
        schema["required"] = required
    return schema


def _field_schema(field: serializers.Field[Any, Any, Any, Any]) -> dict[str, Any]:
    declared = get_override(field, "field")
    if isinstance(declared, dict):
        schema = dict(declared)  # a field that declares its own schema (the flow language, objects)
    elif isinstance(field, Body):
        schema = input_schema(type(field))
    elif isinstance(field, Flag):
        schema = {"type": "boolean"}
    elif isinstance(field, Whole):
        schema = {"type": "integer", "minimum": field.min_value, "maximum": field.max_value}
    elif isinstance(field, Number):
        schema = {"type": "number"}
    elif isinstance(field, Choice):
        schema = {"type": "string", "enum": list(field.choices)}
    elif isinstance(field, Names):
        schema = {"type": "array", "items": {"type": "string"}}
    elif isinstance(field, Text):
        schema = {"type": "string", "maxLength": field.max_length}
    elif isinstance(field, AnyText):
        schema = {"type": "string"}
    elif isinstance(field, AnyWhole):
        schema = {"type": "integer"}
    elif isinstance(field, AnyNumber):
        schema = {"type": ["number", "null"]}
    elif isinstance(field, Obj):
        schema = {"type": "object"}
    else:
        assert isinstance(field, Anything), f"{type(field).__name__} has no schema"
        schema = {}
    if field.help_text:
        schema["description"] = str(field.help_text)
    return schema


# --- the calls -------------------------------------------------------------------------------

def create_task(principal: Principal, spec: Any) -> Mapping[str, Any]:
    # The spec is checked by the service, exactly as for POST /api/tasks.
    named = isinstance(spec, dict) and "source" in spec
    source = channel_source(principal, spec) or (None if named else "mcp")
    return present_task(services.create_task(spec, principal, source=source))


def get_task(principal: Principal, args: dict[str, Any]) -> Mapping[str, Any]:
    task = services.get_task_for(principal, args["task"])
    sections = detail_sections(task)
    return {**present_task(task), "approvals": sections.get("approvals", []), "questions": sections.get("questions", [])}


def list_tasks(principal: Principal, args: dict[str, Any]) -> Mapping[str, Any]:
    return task_page(principal, {name: str(value) for name, value in args.items()})


def read_log(principal: Principal, args: dict[str, Any]) -> Mapping[str, Any]:
    task = services.get_task_for(principal, args["task"])
    return events_after(task, args.get("after", 0), args.get("limit", EVENT_PAGE))


def get_diff(principal: Principal, args: dict[str, Any]) -> Mapping[str, Any]:
    return diff_of(services.get_task_for(principal, args["task"]))


def continue_task(principal: Principal, args: dict[str, Any]) -> Mapping[str, Any]:
    body = {name: value for name, value in args.items() if name != "task"}
    return present_task(approvals.continue_task(principal, args["task"], body))


def keep_task(principal: Principal, args: dict[str, Any]) -> Mapping[str, Any]:
    task, conflicts = verbs.keep_review(principal, args["task"])
    return {**present_task(task), "conflicts": conflicts}


def list_files(principal: Principal, args: dict[str, Any]) -> Mapping[str, Any]:
    return browse_of(workspaces.get_workspace(args["workspace"]), args.get("path"))


TOOLS: dict[str, Tool] = {tool.name: tool for tool in (
    Tool("create_task",
         "Start a task on the box: a 'prompt' for the agent, or a 'flow' ({\"steps\": [...]}, the box's flow "
         "language). The fields are those of POST /api/tasks. Answers at once with the task (its 'id' and "
         "'state'); follow it with get_task until 'final' is true.",
         TaskSpecBody, create_task, read_only=False),
    Tool("get_task",
         "A task now: its state, what it waits for ('waitingFor', 'pause', and the pending 'approvals' and "
         "'questions'), its 'answer' and 'result' once done, its error if it failed, and 'next': the calls that "
         "make sense now.",
         TaskArguments, get_task),
    Tool("list_tasks", "The tasks you may see, newest first, a page at a time.", ListArguments, list_tasks),
    Tool("read_log",
         "A task's log: its events in order (steps, commands, approvals, status changes), a page at a time "
         "from 'after'.",
         LogArguments, read_log),
    Tool("get_diff", "The files a task changed in its workspace, with their changes.", TaskArguments, get_diff),
    Tool("continue_task",
         "Answer what a waiting task asks for: {\"approve\": true} or false for an approval, {\"inputs\": "
         "{name: value}} for values it asked for, {\"answer\": \"...\"} for a question to a person.",
         ContinueArguments, continue_task, read_only=False),
    Tool("cancel_task", "Stop a task (and the tasks it started).", TaskArguments,
         lambda principal, args: present_task(verbs.cancel_task(principal, args["task"])), read_only=False),
    Tool("undo_task", "Take back the changes a finished task made to its workspace.", TaskArguments,
         lambda principal, args: present_task(verbs.undo_task(principal, args["task"])), read_only=False),
    Tool("keep_task",
         "Apply a finished folder task's changes to the owner's real folders (it waits for this review); "
         "answers with 'conflicts', the paths the owner changed too, in which case nothing was applied.",
         TaskArguments, keep_task, read_only=False),
    Tool("list_workspaces", "The workspaces tasks work in.", NoArguments, lambda principal, args: workspace_page()),
    Tool("list_files", "List a folder of a workspace, or read one of its files.", FilesArguments, list_files),
)}


def call(principal: Principal, name: str, arguments: Any) -> Mapping[str, Any]:
    """Run tool ``name`` (it exists: the server checks). Raises the box's errors, as the API does."""
    tool = TOOLS[name]
    if tool.arguments is TaskSpecBody:
        return tool.run(principal, arguments)
    return tool.run(principal, tool.arguments.parse({} if arguments is None else arguments))
