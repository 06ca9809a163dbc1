"""The agent's file tools a coding agent needs: read a file (or a range of its lines), edit by
replacing an exact string, search the files (grep-like) and find them by pattern (glob).

All of them work on the task's own copy (``ctx.workdir``), never outside it (``inside``), and
bound what they give back: the model's context is small and a result past these bounds only
costs tokens.
"""
from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Any

from tasks.run.context import RunContext
from tasks.run.evidence import Evidence, StepFailed
from tasks.workers.file_steps import inside, write_step

READ_CHARS = 20000
SEARCH_MATCHES = 200
SEARCH_LINE_CHARS = 300
SEARCH_FILE_BYTES = 2 * 1024 * 1024  # larger files are not searched
GLOB_ENTRIES = 500
SKIPPED_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv"})


def _text_of(ctx: RunContext, relative: str) -> tuple[Path, str]:
    target = inside(ctx.workdir, relative)
    if not target.is_file():
        raise StepFailed(f"'{relative}' is not a file")
    try:
        return target, target.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise StepFailed(f"'{relative}' is not a UTF-8 text file") from exc


def read_file(ctx: RunContext, relative: str, start_line: int | None, end_line: int | None) -> tuple[Any, Evidence]:
    """A text file, or lines ``start_line``..``end_line`` of it (from 1, both included)."""
    target = inside(ctx.workdir, relative)
    if not target.is_file():
        raise StepFailed(f"'{relative}' is not a file")
    size = target.stat().st_size
    if start_line is None and end_line is None:
        text = target.read_bytes()[:READ_CHARS * 4].decode("utf-8", "replace")
        shown = text[:READ_CHARS]
        result: dict[str, Any] = {"path": relative, "content": shown}
        if len(text) > READ_CHARS or size > READ_CHARS * 4:
            result["cut"] = f"the first {READ_CHARS} characters of {size} bytes; read the rest by start_line/end_line"
        return result, Evidence({"path": relative, "bytes": size})
    return read_lines(target, relative, start_line, end_line)


def read_lines(target: Path, relative: str, start_line: int | None, end_line: int | None) -> tuple[Any, Evidence]:
    """Lines ``start_line``..``end_line`` of the text file ``target`` (from 1, both included), numbered."""
    size = target.stat().st_size
    lines = target.read_bytes().decode("utf-8", "replace").splitlines()
    first = max(1, start_line or 1)
    last = min(len(lines), end_line or len(lines))
    if first > len(lines):
        raise StepFailed(f"'{relative}' has {len(lines)} lines; start_line {first} is past its end")
    content, used = [], 0
    for number in range(first, last + 1):
        line = f"{number}: {lines[number - 1]}"
        if used + len(line) > READ_CHARS:
            last = number - 1
            break
        content.append(line)
        used += len(line) + 1
    return ({"path": relative, "lines": f"{first}-{last} of {len(lines)}", "content": "\n".join(content)},
            Evidence({"path": relative, "bytes": size, "lines": f"{first}-{last}"}))


def edit_file(ctx: RunContext, relative: str, old: str, new: str, replace_all: bool) -> tuple[Any, Evidence]:
    """Replace the exact string ``old`` with ``new``; refused when ``old`` is absent, or found
    more than once without ``replace_all`` (the model says which by giving more of the text)."""
    if not old:
        raise StepFailed("old_string is empty; give the exact text to replace")
    _, text = _text_of(ctx, relative)
    count = text.count(old)
    if count == 0:
        raise StepFailed(f"old_string is not in '{relative}'; read the file and give the exact text, whitespace included")
    if count > 1 and not replace_all:
        raise StepFailed(f"old_string is in '{relative}' {count} times; give more of the text around it, "
                         "or set replace_all to replace every one")
    changed = text.replace(old, new) if replace_all else text.replace(old, new, 1)
    _, evidence = write_step(ctx, {"path": relative, "content": changed})
    evidence.data["replaced"] = count if replace_all else 1
    return {"path": relative, "replaced": evidence.data["replaced"]}, evidence


def _walk(root: Path) -> Any:
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            yield Path(folder) / name


def search_files(ctx: RunContext, pattern: str, relative: str, glob: str | None) -> tuple[Any, Evidence]:
    """Lines matching the regular expression ``pattern`` under ``relative`` (files matching
    ``glob``, when given), as ``path:line: text``; at most ``SEARCH_MATCHES``."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise StepFailed(f"'{pattern}' is not a regular expression: {exc}") from exc
    root = ctx.workdir if relative in ("", ".", "./") else inside(ctx.workdir, relative)
    files = [root] if root.is_file() else _walk(root) if root.is_dir() else None
    if files is None:
        raise StepFailed(f"'{relative}' is not a file or directory")
    matches: list[str] = []
    more = False
    for path in files:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > SEARCH_FILE_BYTES:
            continue
        name = str(path.relative_to(ctx.workdir))
        if glob and not (fnmatch.fnmatch(name, glob) or fnmatch.fnmatch(path.name, glob)):
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if regex.search(line):
                if len(matches) >= SEARCH_MATCHES:
                    more = True
                    break
                matches.append(f"{name}:{number}: {line[:SEARCH_LINE_CHARS]}")
        if more:
            break
    result: dict[str, Any] = {"pattern": pattern, "matches": matches}
    if more:
        result["cut"] = f"the first {SEARCH_MATCHES} matches; narrow the pattern, path or glob"
    return result, Evidence({"pattern": pattern, "path": relative, "matches": len(matches)})


def glob_files(ctx: RunContext, pattern: str) -> tuple[Any, Evidence]:
    """The task's files matching ``pattern`` (``**`` for any depth), sorted; at most ``GLOB_ENTRIES``."""
    if pattern.startswith("/") or ".." in Path(pattern).parts:
        raise StepFailed("the pattern must stay inside the task's files (no leading / and no ..)")
    found: list[str] = []
    more = False
    root = os.path.realpath(ctx.workdir)
    for path in sorted(ctx.workdir.glob(pattern)):
        name = path.relative_to(ctx.workdir)
        real = os.path.realpath(path)
        if SKIPPED_DIRS.intersection(name.parts) or (real != root and not real.startswith(root + os.sep)):
            continue  # a link out of the task's files is not followed
        if len(found) >= GLOB_ENTRIES:
            more = True
            break
        found.append(str(name) + ("/" if path.is_dir() and not path.is_symlink() else ""))
    result: dict[str, Any] = {"pattern": pattern, "paths": found}
    if more:
        result["cut"] = f"the first {GLOB_ENTRIES} paths; narrow the pattern"
    return result, Evidence({"pattern": pattern, "paths": len(found)})
