"""The repository explains itself: code and docs point only at the project's own docs, and every
link to a section of them lands on a heading that exists."""
from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SKIP_DIRS = {".git", ".venv", "var", "node_modules", "__pycache__"}
TEXT_SUFFIXES = {".py", ".md", ".html", ".js", ".css", ".ini", ".txt"}

# Spelled in pieces so this file does not match itself.
OUTSIDE = re.compile("DESIG" + r"N\b|" + "shar" + r"ed/|\u00a7")
# docs/<page>.md#anchor in code, (<page>.md#anchor) or (#anchor) in the docs themselves
DOC_LINK = re.compile(r"(?:docs/)?([a-z_]+\.md)?#([a-z0-9-]+)")


def _project_files() -> list[Path]:
    # Prune skipped folders before descending: var/ changes under a running suite.
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix in TEXT_SUFFIXES or name in {"Makefile", "README.md"}:
                found.append(path)
    return found


def _slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading (GitHub's rule)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def test_nothing_points_outside_the_repository() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _project_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert offenders == []


def test_every_link_to_a_docs_section_lands_on_a_heading() -> None:
    anchors = {page.name: _anchors(page) for page in DOCS.glob("*.md")}
    broken = []
    for path in _project_files():
        in_docs = path.parent == DOCS
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in re.finditer(r"(docs/[a-z_]+\.md#[a-z0-9-]+|\]\((?:[a-z_]+\.md)?#[a-z0-9-]+\))", line):
                link = match.group(0)
                page_match = DOC_LINK.search(link)
                assert page_match is not None
                page, anchor = page_match.group(1), page_match.group(2)
                if page is None:
                    if not in_docs:
                        continue  # an in-page anchor outside docs/ (a template's #id) is not ours
                    page = path.name
                if page not in anchors or anchor not in anchors[page]:
                    broken.append(f"{path.relative_to(ROOT)}:{number}: {link}")
    assert broken == []
