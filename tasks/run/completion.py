"""Completion contracts (docs/internals/task-graph.md#completion-contracts): ``criteria`` a task must
meet before it may become done, checked by the box from what actually happened.

Receipts come from the box's own records, never from a worker's claim: a ``command_exit``
criterion reads the ``step_result`` events the box's workers wrote for this run (a process can
log ``step`` events through the broker, never results); an ``output_file`` criterion reads the
file in the task's own view, refusing a link or anything outside it. Text and JSON are inspected
only up to ``INSPECT_LIMIT`` bytes; the media type is detected from the bytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boxsite.core.errors import InvalidSpec
from tasks.layers import paths
from tasks.models import EventKind, Run, Task, TaskEvent

INSPECT_LIMIT = 1024 * 1024  # bytes of a file read for text, JSON or its media type
MAX_CRITERIA = 50
MAX_OUTPUT_FILES = 100  # output files one run may leave under outputs/
OUTPUT_ROOT = "outputs/"
_KINDS = {"output_file": {"kind", "path", "size", "sha256", "mediaType", "contains", "json"},
          "command_exit": {"kind", "command", "exitCode"}}


def _safe_output_path(raw: Any, field_name: str) -> str:
    if not isinstance(raw, str) or "\x00" in raw or raw.startswith("/") or "\\" in raw:
        raise InvalidSpec(f"'{field_name}' must be a path under {OUTPUT_ROOT}", field=field_name)
    clean = posixpath.normpath(raw)
    if not clean.startswith(OUTPUT_ROOT) or ".." in clean.split("/") or len(clean) > 1024:
        raise InvalidSpec(f"'{raw}' is not a safe path under {OUTPUT_ROOT}", field=field_name)
    return clean


def parse_criteria(value: Any) -> list[dict[str, Any]]:
    """``criteria`` as given, checked whole: a list of ``output_file`` and ``command_exit`` objects."""
    if not isinstance(value, list):
        raise InvalidSpec("'criteria' must be a list of {kind: output_file|command_exit, ...} objects", field="criteria")
    if len(value) > MAX_CRITERIA:
        raise InvalidSpec(f"'criteria' holds at most {MAX_CRITERIA} items", field="criteria")
    out: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        where = f"criteria[{index}]"
        if not isinstance(item, dict) or item.get("kind") not in _KINDS:
            raise InvalidSpec(f"'{where}.kind' must be output_file or command_exit", field=f"{where}.kind")
        unknown = sorted(set(item) - _KINDS[item["kind"]])
        if unknown:
            raise InvalidSpec(f"unknown field '{unknown[0]}' in '{where}'", field=f"{where}.{unknown[0]}")
        checked: dict[str, Any] = {"kind": item["kind"]}
        if item["kind"] == "output_file":
            checked["path"] = _safe_output_path(item.get("path"), f"{where}.path")
            if "size" in item:
                if isinstance(item["size"], bool) or not isinstance(item["size"], int) or item["size"] < 0:
                    raise InvalidSpec(f"'{where}.size' must be a whole number of bytes", field=f"{where}.size")
                checked["size"] = item["size"]
            if "sha256" in item:
                digest = item["sha256"]
                if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower()):
                    raise InvalidSpec(f"'{where}.sha256' must be 64 hex digits", field=f"{where}.sha256")
                checked["sha256"] = digest.lower()
            if "mediaType" in item:
                if not isinstance(item["mediaType"], str) or "/" not in item["mediaType"]:
                    raise InvalidSpec(f"'{where}.mediaType' must be a media type such as image/png", field=f"{where}.mediaType")
                checked["mediaType"] = item["mediaType"]
            if "contains" in item:
                if not isinstance(item["contains"], str) or not item["contains"] or len(item["contains"]) > 10_000:
                    raise InvalidSpec(f"'{where}.contains' must be a non-empty string", field=f"{where}.contains")
                checked["contains"] = item["contains"]
            if "json" in item:
                pointers = item["json"]
                if not isinstance(pointers, dict) or not pointers or not all(
                        isinstance(p, str) and (p == "" or p.startswith("/")) for p in pointers):
                    raise InvalidSpec(f"'{where}.json' must map JSON Pointers (RFC 6901) to expected values",
                                      field=f"{where}.json")
                checked["json"] = dict(pointers)
        else:
            command = item.get("command")
            if not isinstance(command, str) or not command.strip():
                raise InvalidSpec(f"'{where}.command' must be the exact command", field=f"{where}.command")
            code = item.get("exitCode", 0)
            if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
                raise InvalidSpec(f"'{where}.exitCode' must be 0-255", field=f"{where}.exitCode")
            checked.update(command=command, exitCode=code)
        out.append(checked)
    return out


# --- evidence --------------------------------------------------------------------------------

def media_type(head: bytes) -> str:
    """The media type of a file from its first bytes (never its name)."""
    signatures = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
                  (b"GIF89a", "image/gif"), (b"%PDF-", "application/pdf"), (b"PK\x03\x04", "application/zip"),
                  (b"\x1f\x8b", "application/gzip"), (b"\x7fELF", "application/x-executable"))
    for magic, kind in signatures:
        if head.startswith(magic):
            return kind
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    if "\x00" in text:
        return "application/octet-stream"
    try:
        json.loads(text)
        return "application/json"
    except ValueError:
        return "text/plain"


def _pointer(document: Any, pointer: str) -> tuple[bool, Any]:
    """RFC 6901: (found, value)."""
    if pointer == "":
        return True, document
    current = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict) and token in current:
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current) and (token == "0" or not token.startswith("0")):
            current = current[int(token)]
        else:
            return False, None
    return True, current


def _open_inside(root: Path, rel: str) -> tuple[int, os.stat_result] | str:
    """An fd for ``rel`` under ``root``, reached without following any link, or why not."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return "the task has no files to read"
    try:
        parts = rel.split("/")
        for part in parts[:-1]:
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return "no such file (or a link, which does not count)"
    finally:
        os.close(fd)
    info = os.fstat(leaf)
    if not stat.S_ISREG(info.st_mode):
        os.close(leaf)
        return "not a regular file"
    return leaf, info


def file_receipt(view: Path, criterion: dict[str, Any]) -> dict[str, Any]:
    """What the file under ``view`` is: size, SHA-256, detected media type, and each check."""
    opened = _open_inside(view, criterion["path"])
    if isinstance(opened, str):
        return {"ok": False, "why": opened}
    fd, info = opened
    digest = hashlib.sha256()
    head = b""
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(1 << 20):
            if len(head) < INSPECT_LIMIT + 1:
                head += chunk[: INSPECT_LIMIT + 1 - len(head)]
            digest.update(chunk)
    receipt: dict[str, Any] = {"size": info.st_size, "sha256": digest.hexdigest(), "mediaType": media_type(head[:INSPECT_LIMIT])}
    problems = []
    if "size" in criterion and criterion["size"] != receipt["size"]:
        problems.append(f"size is {receipt['size']} bytes, not {criterion['size']}")
    if "sha256" in criterion and criterion["sha256"] != receipt["sha256"]:
        problems.append("SHA-256 differs")
    if "mediaType" in criterion and criterion["mediaType"] != receipt["mediaType"]:
        problems.append(f"its bytes are {receipt['mediaType']}, not {criterion['mediaType']}")
    if "contains" in criterion or "json" in criterion:
        if info.st_size > INSPECT_LIMIT:
            problems.append(f"it is larger than the {INSPECT_LIMIT}-byte inspection limit")
        else:
            try:
                text = head.decode("utf-8")
            except UnicodeDecodeError:
                text = None
                problems.append("it is not UTF-8 text")
            if text is not None and "contains" in criterion and criterion["contains"] not in text:
                problems.append("the expected text is not in it")
            if text is not None and "json" in criterion:
                try:
                    document = json.loads(text)
                except ValueError:
                    problems.append("it is not JSON")
                else:
                    for pointer, expected in criterion["json"].items():
                        found, value = _pointer(document, pointer)
                        if not found:
                            problems.append(f"no value at {pointer or '(the root)'}")
                        elif value != expected or type(value) is not type(expected):
                            problems.append(f"{pointer or '(the root)'} is {json.dumps(value)[:80]}, not {json.dumps(expected)[:80]}")
    receipt["ok"] = not problems
    if problems:
        receipt["why"] = "; ".join(problems)
    return receipt


def command_receipt(task: Task, run: Run, criterion: dict[str, Any]) -> dict[str, Any]:
    """The last result the box recorded in this run for exactly ``command``."""
    results = TaskEvent.objects.filter(task=task, kind=EventKind.STEP_RESULT, data__command=criterion["command"])
    if run.started_at is not None:
        results = results.filter(created_at__gte=run.started_at)
    last = results.order_by("-seq").first()
    if last is None:
        return {"ok": False, "why": "the box recorded no run of that exact command in this run"}
    code = last.data.get("exitCode")
    receipt = {"exitCode": code, "event": last.seq}
    if code != criterion["exitCode"]:
        return {**receipt, "ok": False, "why": f"it exited {code}, not {criterion['exitCode']}"}
    return {**receipt, "ok": True}


@dataclass
class Report:
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.results)

    def failures(self) -> str:
        bad = [f"{r['criterion'].get('path') or r['criterion'].get('command')}: {r['why']}" for r in self.results if not r["ok"]]
        return "; ".join(bad)


def count_outputs(view: Path) -> int:
    root = view / "outputs"
    if root.is_symlink() or not root.is_dir():
        return 0
    return sum(len(files) for _, _, files in os.walk(root))


def evaluate(task: Task, run: Run) -> Report:
    """Every criterion against what this run really left."""
    view = paths.view_dir(task.pk)
    report = Report()
    outputs = count_outputs(view)
    if outputs > MAX_OUTPUT_FILES:
        report.results.append({"criterion": {"kind": "output_set", "path": OUTPUT_ROOT}, "ok": False,
                               "why": f"{outputs} output files; at most {MAX_OUTPUT_FILES} are taken, so none were"})
    for criterion in task.criteria or []:
        if criterion["kind"] == "output_file":
            receipt = file_receipt(view, criterion)
        else:
            receipt = command_receipt(task, run, criterion)
        report.results.append({"criterion": criterion, **receipt})
    return report
