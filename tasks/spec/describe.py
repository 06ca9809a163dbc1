"""The guide to writing flows (``GET /api/describe``): the flow language, each step kind's
schema and worked examples. The planner gives it to the model; a waiting-for-plan task points
to it; a calling program or model can read it and write flows itself."""
from __future__ import annotations

from typing import Annotated, Any, TypedDict

from boxsite.core.shapes import Doc, Raw
from tasks.spec.flows import COMMON_KEYS, EXTRA_KEYS, STEP_KINDS


class StepGuide(TypedDict):
    acts: Annotated[bool, Doc("the step changes something (it may carry stop_before)")]
    what: str
    schema: Annotated[dict[str, Any], Doc("a JSON Schema of the step")]


class Example(TypedDict):
    task: str
    flow: Annotated[dict[str, Any], Raw(flow_schema())]  # read when the schema is made: defined below


class Describe(TypedDict):
    flowLanguage: list[str]
    commonKeys: dict[str, str]
    steps: Annotated[dict[str, StepGuide], Doc("per step kind")]
    examples: list[Example]
    howToStart: str


WHAT = {
    "run": "a shell command in the task's sandbox (string, or {cmd, env}); a non-zero exit fails the step; "
           "its standard output is the step's result",
    "write": "write a file of the task's copy: {path, content}",
    "delete": "delete a file or directory of the task's copy: a path, or {path}",
    "http": "an HTTP request through the task's host policy: a URL, or {url, method, headers, body}",
    "tool": "call a broker tool the task lists: the tool's name, with 'args' beside it",
    "browse": "open a page in the task's browser: a URL, or {url}",
    "click": "click an element: a selector, or a target {selector|text|role (+name)|label|placeholder|describe, frame?}; "
             "a download it starts is saved to downloads/ of the task's files, a tab it opens becomes the page",
    "fill": "type into a field: {<target>, value}; a <select> gets the option with that label",
    "pick": "choose one of several elements: {<target of the items>, by: first|last|cheapest|highest, where?, price?, "
            "click? (a target inside the item, or false)}; on a <select>, {<target>, option}",
    "press": "press keys: \"Enter\", \"Control+A\", or {keys (one or a list), <target>?} (without a target, on the "
             "focused element); Enter in a form submits it and is guarded like a click on its submit button",
    "select": "choose options of a <select>: {<target>, option (a label or value, or a list for a multiple select)}",
    "upload": "put files of the task's files into a file input (or the chooser a button opens): {<target>, file (a "
              "relative path, or a list)}; no '..', no absolute path, no link out",
    "wait": "wait until something is so: a selector, \"network\" (idle) or \"load\"; or {<target>, state?: "
            "visible|hidden|attached|detached} or {url: part of the address}; timeout_s bounds it",
    "tab": "act on another tab from now on: \"first\", \"last\", \"previous\", {index (from 1)} or {url: part of its address}",
    "extract": "read the page into records: a selector, or {<target>, fields?, limit?}; or {describe: what to read in plain "
               "words, schema?: JSON Schema of the answer} (the model reads the page)",
    "screenshot": "take a screenshot of the page: true, or {full_page}",
    "model": "one model call: a prompt, or {prompt, schema (JSON Schema of the answer), system}",
    "ask": "ask the owner for a named value: a name, or {name, why, kind, options}",
    "approve": "wait for the owner's OK: a reason",
    "checkpoint": "stop for the owner at a checkpoint: a reason, or {reason, payment, continuable}",
}
COMMON = {
    "name": "a label for the step in the log",
    "save": "keep the step's result under this name; later steps use it as ${name}",
    "stop_before": "a reason: pause for the owner's OK before this step acts (only on steps that act)",
    "timeout_s": "seconds the step may take",
}
EXAMPLES: list[Example] = [
    {"task": "Count the Python files and write the number to count.txt",
     "flow": {"steps": [{"run": "find . -name '*.py' | wc -l", "save": "count"},
                        {"write": {"path": "count.txt", "content": "${count}"}}]}},
    {"task": "Fetch the project's open issues and summarise them",
     "flow": {"steps": [{"http": "https://api.github.com/repos/OWNER/REPO/issues", "save": "issues"},
                        {"model": {"prompt": "Summarise these issues in five lines: ${issues}"}, "save": "summary"},
                        {"write": {"path": "summary.md", "content": "${summary}"}}]}},
    {"task": "Delete the build directory after the owner agrees",
     "flow": {"steps": [{"delete": "build", "stop_before": "this deletes the build directory"}]}},
    {"task": "Search a shop for a flight, open the first offer's terms in their new tab and read the bag allowance",
     "flow": {"steps": [{"browse": "https://shop.example/search"},
                        {"fill": {"label": "Search flights", "value": "DEL BOM"}},
                        {"press": {"label": "Search flights", "keys": "Enter"}},
                        {"wait": {"text": "Results"}},
                        {"click": {"text": "Terms"}},
                        {"extract": {"describe": "the checked bag allowance in kg",
                                     "schema": {"type": "object", "properties": {"kg": {"type": "number"}}}},
                         "save": "bags"},
                        {"tab": "first"}]}},
    {"task": "Send the report to an address the owner gives",
     "flow": {"steps": [{"ask": {"name": "email", "why": "where the report goes"}},
                        {"tool": "mail.send", "args": {"to": "${email}", "subject": "Report"}, "stop_before": "it sends mail"}]}},
]
RULES = [
    "A flow is a JSON object {\"vars\": {...}, \"steps\": [...]}; vars is optional.",
    "Each step has exactly one kind key, plus the optional common keys.",
    "${name} is replaced by a fact, a var, or an earlier step's save; a name nothing supplies makes the task ask the owner for it.",
    "Secret values reach a model only as ${name}; write ${name} where one is needed.",
    "Put stop_before on every step that deletes, sends, publishes or pays.",
    "Paying is never automatic: a payment page is a checkpoint with payment: true.",
    "A browser step's <target> is one of selector (CSS, piercing open shadow roots), text, role (with name), label, "
    "placeholder or describe (plain words); add frame (the selector of an <iframe>, or {url: part of its address}) "
    "for an element inside a frame.",
    "An acting browser step may carry dialog: \"accept\", \"dismiss\" or {accept: text for a prompt}; a dialog no "
    "step answers is dismissed and logged.",
]
# The keys beside a kind key that belong to it (flows.EXTRA_KEYS).
EXTRA_SCHEMAS: dict[str, dict[str, Any]] = {
    "args": {"type": "object"},
    "dialog": {"anyOf": [{"enum": ["accept", "dismiss"]},
                         {"type": "object", "properties": {"accept": {"type": "string"}}, "required": ["accept"],
                          "additionalProperties": False}]},
}


def step_schema(kind: str) -> dict[str, Any]:
    """A JSON Schema of one step of ``kind`` (as validation checks it)."""
    spec = STEP_KINDS[kind]
    shapes: list[dict[str, Any]] = []
    for shape in spec.shapes:
        if shape == "str":
            shapes.append({"type": "string"})
        elif shape == "bool":
            shapes.append({"type": "boolean"})
        elif shape == "object":
            shapes.append({"type": "object", "required": list(spec.required)})
        else:
            shapes.append({})
    properties: dict[str, Any] = {kind: {"anyOf": shapes} if len(shapes) > 1 else shapes[0],
                                  "name": {"type": "string"}, "save": {"type": "string"},
                                  "timeout_s": {"type": "number", "exclusiveMinimum": 0}}
    if spec.acts:
        properties["stop_before"] = {"type": "string"}
    for extra in EXTRA_KEYS.get(kind, set()):
        properties[extra] = EXTRA_SCHEMAS[extra]
    return {"type": "object", "description": WHAT.get(kind, kind), "properties": properties, "required": [kind],
            "additionalProperties": False}


def flow_schema() -> dict[str, Any]:
    """A JSON Schema of a whole flow: one of the step kinds' schemas per step."""
    return {
        "type": "object", "description": RULES[0],
        "properties": {
            "vars": {"type": "object"},
            "steps": {"type": "array", "minItems": 1, "items": {"oneOf": [step_schema(kind) for kind in STEP_KINDS]}},
            "memory": {"type": "array", "items": {
                "type": "object", "required": ["instruction", "selector"], "additionalProperties": False,
                "properties": {"instruction": {"type": "string"}, "selector": {"type": "string"}, "page": {"type": "string"}}}},
            "trace": {"type": "boolean"},
        },
        "required": ["steps"], "additionalProperties": False,
    }


def guide() -> Describe:
    return {
        "flowLanguage": RULES,
        "commonKeys": {k: COMMON[k] for k in sorted(COMMON_KEYS)},
        "steps": {name: {"acts": kind.acts, "what": WHAT.get(name, ""), "schema": step_schema(name)}
                  for name, kind in STEP_KINDS.items()},
        "examples": EXAMPLES,
        "howToStart": "POST /api/tasks with {\"title\", \"flow\"} (worker flow); or {\"title\", \"prompt\", \"worker\": \"flow\"} "
                  "to have the box's model plan it",
    }
