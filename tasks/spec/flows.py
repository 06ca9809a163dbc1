"""The flow language (docs/internals/run-path.md#flows): validation and the names a flow uses.

A flow is ``{"vars": {...}, "steps": [...]}``. A step has exactly one kind key plus optional
``name``, ``save``, ``stop_before`` and ``timeout_s``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from boxsite.core.errors import InvalidFlow
from tasks.spec.browser_steps import TARGET_KEYS, check_browser_step
from tasks.spec.schemas import schema_problem
from tasks.vault.facts import names_in


@dataclass(frozen=True)
class StepKind:
    name: str
    acts: bool
    # The accepted shapes of the kind's value: "str", "object", "bool", or "any".
    shapes: tuple[str, ...]
    required: tuple[str, ...] = ()  # required keys when the value is an object


STEP_KINDS: dict[str, StepKind] = {
    k.name: k
    for k in (
        StepKind("run", True, ("str", "object"), ("cmd",)),
        StepKind("write", True, ("object",), ("path", "content")),
        StepKind("delete", True, ("str", "object"), ("path",)),
        StepKind("http", True, ("str", "object"), ("url",)),
        StepKind("tool", True, ("str",)),
        StepKind("browse", True, ("str", "object"), ("url",)),
        StepKind("click", True, ("str", "object")),
        StepKind("fill", True, ("object",), ("value",)),
        StepKind("pick", True, ("str", "object")),
        StepKind("press", True, ("str", "object"), ("keys",)),
        StepKind("select", True, ("object",), ("option",)),
        StepKind("upload", True, ("object",), ("file",)),
        StepKind("wait", False, ("str", "object")),
        StepKind("tab", False, ("str", "object")),
        StepKind("extract", False, ("str", "object")),
        StepKind("screenshot", False, ("str", "object", "bool")),
        StepKind("model", False, ("str", "object"), ("prompt",)),
        StepKind("ask", False, ("str", "object"), ("name",)),
        StepKind("approve", False, ("str", "object")),
        StepKind("checkpoint", False, ("str", "object")),
    )
}
COMMON_KEYS = {"name", "save", "stop_before", "timeout_s"}
# Keys beside the kind key that belong to that kind: a tool's arguments; how a browser step
# answers a dialog the page opens while it acts (tasks/spec/browser_steps.py).
EXTRA_KEYS = {"tool": {"args"}, **{k: {"dialog"} for k in ("browse", "click", "fill", "pick", "press", "select", "upload")}}
# Kinds the flow worker executes now; the rest validate but are refused at run time.
EXECUTABLE_KINDS = {"run", "write", "delete", "http", "tool", "model", "ask", "approve", "checkpoint",
                    "browse", "click", "fill", "pick", "press", "select", "upload", "wait", "tab", "extract", "screenshot"}

_SHAPE_TYPES = {"str": str, "object": dict, "bool": bool}
TARGETED_KINDS = ("click", "fill", "pick", "select", "upload")


def step_kind(step: dict[str, Any]) -> str:
    return next(k for k in step if k in STEP_KINDS)


def _check_shape(kind: StepKind, value: Any, where: str) -> None:
    if "any" in kind.shapes:
        return
    if not any(isinstance(value, _SHAPE_TYPES[s]) for s in kind.shapes):
        wanted = " or ".join("a string" if s == "str" else "an object" if s == "object" else "true/false" for s in kind.shapes)
        raise InvalidFlow(f"{where}: '{kind.name}' takes {wanted}", field=where)
    if isinstance(value, dict):
        for key in kind.required:
            if key not in value:
                raise InvalidFlow(f"{where}: '{kind.name}' needs '{key}'", field=f"{where}.{kind.name}.{key}")
        if kind.name in TARGETED_KINDS and not any(k in value for k in TARGET_KEYS):
            raise InvalidFlow(f"{where}: '{kind.name}' needs a target: one of {', '.join(TARGET_KEYS)}",
                              field=f"{where}.{kind.name}")


def check_memory(flow: dict[str, Any], field: str) -> None:
    """``memory``: grounding hints from an earlier run (``{instruction, selector, page?}``);
    ``trace``: true to record every model exchange whole. In a flow (``field`` is its name) or
    at the top of a task spec (``field`` empty)."""
    where = f"{field}." if field else ""
    memory = flow.get("memory", [])
    if not isinstance(memory, list) or not all(
            isinstance(m, dict) and isinstance(m.get("instruction"), str) and isinstance(m.get("selector"), str)
            and isinstance(m.get("page", ""), str) and not set(m) - {"instruction", "selector", "page"} for m in memory):
        raise InvalidFlow("'memory' is a list of {instruction, selector, page}", field=f"{where}memory")
    if not isinstance(flow.get("trace", False), bool):
        raise InvalidFlow("'trace' must be true or false", field=f"{where}trace")


def validate_flow(flow: Any, field: str = "flow") -> dict[str, Any]:
    """Raise ``InvalidFlow`` naming the first problem; return the flow unchanged when valid."""
    if not isinstance(flow, dict):
        raise InvalidFlow("a flow is an object with 'steps'", field=field)
    unknown = set(flow) - {"vars", "steps", "memory", "trace"}
    if unknown:
        raise InvalidFlow(f"unknown flow key '{sorted(unknown)[0]}'", field=f"{field}.{sorted(unknown)[0]}")
    check_memory(flow, field)
    vars_ = flow.get("vars", {})
    if not isinstance(vars_, dict):
        raise InvalidFlow("'vars' must be an object", field=f"{field}.vars")
    steps = flow.get("steps")
    if not isinstance(steps, list) or not steps:
        raise InvalidFlow("a flow needs a non-empty list of 'steps'", field=f"{field}.steps")
    for index, step in enumerate(steps):
        where = f"{field}.steps[{index}]"
        if not isinstance(step, dict):
            raise InvalidFlow(f"{where}: a step is an object", field=where)
        kinds = [k for k in step if k in STEP_KINDS]
        if not kinds:
            others = sorted(set(step) - COMMON_KEYS)
            hint = f" ('{others[0]}' is not a step kind)" if others else ""
            raise InvalidFlow(f"{where}: no step kind{hint}", field=where)
        if len(kinds) > 1:
            raise InvalidFlow(f"{where}: two step kinds ({kinds[0]}, {kinds[1]}); a step has exactly one", field=where)
        kind = STEP_KINDS[kinds[0]]
        allowed = COMMON_KEYS | {kind.name} | EXTRA_KEYS.get(kind.name, set())
        extra = sorted(set(step) - allowed)
        if extra:
            raise InvalidFlow(f"{where}: unknown key '{extra[0]}'", field=f"{where}.{extra[0]}")
        _check_shape(kind, step[kind.name], where)
        if kind.name == "model":
            _check_model_step(step["model"], where)
        if kind.name in ("write", "delete"):
            _check_path(step[kind.name], where, kind.name)
        if kind.name in BROWSER_KINDS:
            check_browser_step(kind.name, step, where)
        if "args" in step and not isinstance(step["args"], dict):
            raise InvalidFlow(f"{where}: 'args' must be an object", field=f"{where}.args")
        if "stop_before" in step:
            if not isinstance(step["stop_before"], str) or not step["stop_before"].strip():
                raise InvalidFlow(f"{where}: 'stop_before' is a reason (a non-empty string)", field=f"{where}.stop_before")
            if not kind.acts:
                raise InvalidFlow(f"{where}: 'stop_before' on a '{kind.name}' step, which does not act", field=f"{where}.stop_before")
        for key in ("name", "save"):
            if key in step and (not isinstance(step[key], str) or not step[key]):
                raise InvalidFlow(f"{where}: '{key}' must be a non-empty string", field=f"{where}.{key}")
        if "timeout_s" in step:
            t = step["timeout_s"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
                raise InvalidFlow(f"{where}: 'timeout_s' must be a positive number", field=f"{where}.timeout_s")
    return flow


def _check_path(value: Any, where: str, kind: str) -> None:
    """A ``write``'s or ``delete``'s path: relative, and not above the task's files. One with a
    ``${...}`` is filled in at run time and checked there (``workers.file_steps.inside``, which also
    refuses a link out)."""
    path, field = (value, f"{where}.{kind}") if isinstance(value, str) else (value["path"], f"{where}.{kind}.path")
    if not isinstance(path, str) or not path:
        raise InvalidFlow(f"{where}: '{kind}' needs a path (a non-empty string)", field=field)
    if "${" in path:
        return
    depth = 0
    for part in path.split("/"):
        depth += -1 if part == ".." else 0 if part in ("", ".") else 1
        if depth < 0:
            break
    if path.startswith("/") or depth < 0:
        raise InvalidFlow(f"{where}: '{path}' is not a relative path inside the task's files", field=field)


MODEL_KEYS = {"prompt", "schema", "system"}


def _check_model_step(value: Any, where: str) -> None:
    """A ``model`` step: a prompt, or ``{prompt, schema?, system?}`` where ``schema`` is a JSON
    Schema its answer must satisfy."""
    if isinstance(value, str):
        if not value.strip():
            raise InvalidFlow(f"{where}: 'model' needs a prompt", field=f"{where}.model")
        return
    extra = sorted(set(value) - MODEL_KEYS)
    if extra:
        raise InvalidFlow(f"{where}: unknown key '{extra[0]}' in 'model' (it takes prompt, schema, system)",
                          field=f"{where}.model.{extra[0]}")
    for key in ("prompt", "system"):
        if key in value and (not isinstance(value[key], str) or (key == "prompt" and not value[key].strip())):
            raise InvalidFlow(f"{where}: 'model.{key}' must be a non-empty string", field=f"{where}.model.{key}")
    if "schema" in value:
        problem = schema_problem(value["schema"])
        if problem:
            raise InvalidFlow(f"{where}: 'model.schema' is not a usable JSON Schema: {problem}", field=f"{where}.model.schema")


BROWSER_KINDS = ("browse", "click", "fill", "pick", "press", "select", "upload", "wait", "tab", "extract", "screenshot")


def uses_browser(flow: dict[str, Any]) -> bool:
    return any(step_kind(step) in BROWSER_KINDS for step in flow["steps"])


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def missing_names(flow: dict[str, Any], facts: dict[str, Any]) -> list[str]:
    """Names used as ``${name}`` that no fact, var or earlier ``save`` supplies, in order."""
    known = set(facts) | set(flow.get("vars", {}))
    missing: list[str] = []
    for value in flow.get("vars", {}).values():
        for name in (n for s in _strings(value) for n in names_in(s)):
            if name not in known and name not in missing:
                missing.append(name)
    for step in flow["steps"]:
        kind = step_kind(step)
        used = [n for s in _strings({k: v for k, v in step.items() if k not in ("name", "save")}) for n in names_in(s)]
        if kind == "ask":
            value = step["ask"]
            asked = value if isinstance(value, str) else value.get("name")
            known.add(str(asked))
        for name in used:
            if name not in known and name not in missing:
                missing.append(name)
        if "save" in step:
            known.add(step["save"])
    return missing
