"""What a flow's browser steps may say, checked when the task is created (``tasks.spec.flows``
calls ``check_browser_step``): targets (a ``frame`` too), the keys of ``press``, ``select``,
``upload``, ``wait`` and ``tab``, an ``extract`` from plain words, and the ``dialog`` answer an
acting step gives. A mistake is ``InvalidFlow`` naming the field.
"""
from __future__ import annotations

import re
from typing import Any

from boxsite.core.errors import InvalidFlow
from tasks.spec.schemas import schema_problem

# How a browser step names its element (tasks/browser/steps.py): one of these keys...
TARGET_KEYS = ("selector", "text", "role", "label", "placeholder", "describe")
# ...with these beside it: the accessible name of a role, exact matching, the frame it is in.
TARGET_EXTRAS = ("name", "exact", "frame")
DIALOG_ANSWERS = ("accept", "dismiss")
WAIT_STATES = ("visible", "hidden", "attached", "detached")
TAB_WORDS = ("first", "last", "previous")
# Key names Playwright's keyboard knows besides single characters (KeyboardEvent.key values).
KEY_NAMES = frozenset({
    "Enter", "Tab", "Escape", "Backspace", "Delete", "Insert", "Space", "Home", "End", "PageUp", "PageDown",
    "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Shift", "Control", "Alt", "Meta", "ControlOrMeta",
    "CapsLock", "NumLock", "ScrollLock", "ContextMenu", "Pause", "PrintScreen", "NumpadEnter", "NumpadAdd",
    "NumpadSubtract", "NumpadMultiply", "NumpadDivide", "NumpadDecimal",
    *(f"F{n}" for n in range(1, 13)), *(f"Digit{n}" for n in range(10)), *(f"Numpad{n}" for n in range(10)),
    *(f"Key{c}" for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
})
_KINDS_WITH_KEYS = {
    "press": {"keys", *TARGET_KEYS, *TARGET_EXTRAS},
    "select": {"option", *TARGET_KEYS, *TARGET_EXTRAS},
    "upload": {"file", *TARGET_KEYS, *TARGET_EXTRAS},
    "wait": {"network", "load", "url", "state", *TARGET_KEYS, *TARGET_EXTRAS},
    "tab": {"index", "url"},
}


def check_browser_step(kind: str, step: dict[str, Any], where: str) -> None:
    """The parts of browser step ``step`` (of ``kind``) its shape check does not cover."""
    value = step[kind]
    field = f"{where}.{kind}"
    if "dialog" in step:
        check_dialog(step["dialog"], f"{where}.dialog")
    if isinstance(value, dict):
        allowed = _KINDS_WITH_KEYS.get(kind)
        if allowed is not None:
            extra = sorted(set(value) - allowed)
            if extra:
                raise InvalidFlow(f"{where}: unknown key '{extra[0]}' in '{kind}' (it takes {', '.join(sorted(allowed))})",
                                  field=f"{field}.{extra[0]}")
        if "frame" in value:
            _check_frame(value["frame"], f"{field}.frame", where)
    if kind == "press":
        _check_keys(value if isinstance(value, str) else value.get("keys"), field if isinstance(value, str) else f"{field}.keys", where)
    elif kind == "select":
        _check_strings(value["option"], f"{field}.option", where, "'select.option' is an option's label or value, or a list of them")
    elif kind == "upload":
        files = value["file"]
        _check_strings(files, f"{field}.file", where, "'upload.file' is a path in the task's files, or a list of them")
        for path in [files] if isinstance(files, str) else files:
            check_inside_path(path, f"{field}.file", where)
    elif kind == "wait":
        _check_wait(value, field, where)
    elif kind == "tab":
        _check_tab(value, field, where)
    elif kind == "extract" and isinstance(value, dict):
        _check_extract(value, field, where)


def check_dialog(value: Any, field: str) -> None:
    """``dialog``: ``"accept"``, ``"dismiss"``, or ``{"accept": text}`` (the text typed into a prompt)."""
    if value in DIALOG_ANSWERS:
        return
    if isinstance(value, dict) and set(value) == {"accept"} and isinstance(value["accept"], str):
        return
    raise InvalidFlow(f"'dialog' is \"accept\", \"dismiss\" or {{\"accept\": text for a prompt}}, not {value!r}", field=field)


def check_inside_path(path: Any, field: str, where: str) -> None:
    """A path in the task's files: relative, with no ``..`` at all (a link out is refused when
    the step runs, ``tasks.workers.file_steps.inside``)."""
    if not isinstance(path, str) or not path.strip():
        raise InvalidFlow(f"{where}: a path is a non-empty string", field=field)
    if "\x00" in path or path.startswith(("/", "~")) or ".." in path.replace("\\", "/").split("/"):
        raise InvalidFlow(f"{where}: '{path}' is not a path inside the task's files (relative, no '..')", field=field)


def _check_frame(value: Any, field: str, where: str) -> None:
    if isinstance(value, str) and value.strip():
        return
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("selector", "url") \
            and isinstance(next(iter(value.values())), str) and next(iter(value.values())).strip():
        return
    raise InvalidFlow(f"{where}: 'frame' is the selector of the frame, or {{\"url\": part of its address}} "
                      "or {\"selector\": ...}", field=field)


def _check_keys(keys: Any, field: str, where: str) -> None:
    chords = [keys] if isinstance(keys, str) else keys
    if not isinstance(chords, list) or not chords or not all(isinstance(c, str) and c for c in chords):
        raise InvalidFlow(f"{where}: 'press' takes keys: \"Enter\", \"Control+A\", or a list of them", field=field)
    for chord in chords:
        # "+" alone is the plus key; "Shift++" is Shift with it.
        parts = ["+"] if chord == "+" else re.split(r"(?<!^)\+(?!$)", chord)
        for part in parts:
            if len(part) != 1 and part not in KEY_NAMES:
                raise InvalidFlow(f"{where}: '{part}' in '{chord}' is not a key (a character, or a name such as Enter, "
                                  "Tab, Escape, ArrowDown, Control, Shift, Alt, Meta, F1)", field=field)


def _check_strings(value: Any, field: str, where: str, message: str) -> None:
    if isinstance(value, str) and value:
        return
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return
    raise InvalidFlow(f"{where}: {message}", field=field)


def _check_wait(value: Any, field: str, where: str) -> None:
    """``wait``: a selector, ``"network"`` (idle) or ``"load"``; or an object with one target,
    or ``network``, ``load`` or ``url`` (part of the page's address)."""
    if isinstance(value, str):
        if not value.strip():
            raise InvalidFlow(f"{where}: 'wait' needs a selector, \"network\" or \"load\"", field=field)
        return
    what = [k for k in (*TARGET_KEYS, "network", "load", "url") if k in value]
    if len(what) != 1:
        raise InvalidFlow(f"{where}: 'wait' waits for one thing: a target ({', '.join(TARGET_KEYS[:-1])}), "
                          "'network' (idle), 'load' or 'url'", field=field)
    if what[0] == "describe":
        raise InvalidFlow(f"{where}: 'wait' needs a target the page can be watched for, not 'describe'", field=f"{field}.describe")
    if what[0] == "network" and value["network"] not in ("idle", True):
        raise InvalidFlow(f"{where}: 'wait.network' is \"idle\"", field=f"{field}.network")
    if what[0] == "load" and value["load"] is not True:
        raise InvalidFlow(f"{where}: 'wait.load' is true", field=f"{field}.load")
    if what[0] == "url" and (not isinstance(value["url"], str) or not value["url"]):
        raise InvalidFlow(f"{where}: 'wait.url' is part of the page's address (a non-empty string)", field=f"{field}.url")
    if "state" in value:
        if what[0] not in TARGET_KEYS or value["state"] not in WAIT_STATES:
            raise InvalidFlow(f"{where}: 'wait.state' is one of {', '.join(WAIT_STATES)}, beside a target", field=f"{field}.state")
    if "frame" in value and what[0] not in TARGET_KEYS:
        raise InvalidFlow(f"{where}: 'frame' goes with a target", field=f"{field}.frame")


def _check_tab(value: Any, field: str, where: str) -> None:
    """``tab``: ``"first"``, ``"last"``, ``"previous"``, ``{"index": n}`` (from 1) or ``{"url": part}``."""
    if isinstance(value, str):
        if value not in TAB_WORDS:
            raise InvalidFlow(f"{where}: 'tab' is one of {', '.join(TAB_WORDS)}, {{\"index\": n}} or {{\"url\": ...}}", field=field)
        return
    if len(value) != 1:
        raise InvalidFlow(f"{where}: 'tab' takes one of 'index' or 'url'", field=field)
    if "index" in value and not (isinstance(value["index"], int) and not isinstance(value["index"], bool) and value["index"] >= 1):
        raise InvalidFlow(f"{where}: 'tab.index' is a tab's position, from 1", field=f"{field}.index")
    if "url" in value and (not isinstance(value["url"], str) or not value["url"]):
        raise InvalidFlow(f"{where}: 'tab.url' is part of the tab's address", field=f"{field}.url")


def _check_extract(value: dict[str, Any], field: str, where: str) -> None:
    """``extract`` from plain words: ``{"describe": what to read, "schema": JSON Schema}``."""
    if "schema" in value and "describe" not in value:
        raise InvalidFlow(f"{where}: 'extract.schema' goes with 'describe' (what to read, in plain words)", field=f"{field}.schema")
    if "describe" not in value:
        return
    if not isinstance(value["describe"], str) or not value["describe"].strip():
        raise InvalidFlow(f"{where}: 'extract.describe' says what to read, in plain words", field=f"{field}.describe")
    extra = sorted(set(value) - {"describe", "schema"})
    if extra:
        raise InvalidFlow(f"{where}: 'extract' with 'describe' takes only 'schema' beside it, not '{extra[0]}'",
                          field=f"{field}.{extra[0]}")
    if "schema" in value:
        problem = schema_problem(value["schema"])
        if problem:
            raise InvalidFlow(f"{where}: 'extract.schema' is not a usable JSON Schema: {problem}", field=f"{field}.schema")

