"""The repository explains itself: code and docs point only at the project's own docs, every
link to a section of them lands on a heading that exists, and no page is too long to read."""
from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SKIP_DIRS = {".git", ".venv", "var", "node_modules", "__pycache__"}
TEXT_SUFFIXES = {".py", ".md", ".html", ".js", ".css", ".ini", ".txt"}
MAX_WORDS = 5000

# Spelled in pieces so this file does not match itself.
OUTSIDE = re.compile("DESIG" + r"N\b|" + "shar" + r"ed/|\u00a7")
# In code: docs/<folder>/<page>.md#anchor, read from the repository's root.
CODE_LINK = re.compile(r"\bdocs/((?:[a-z_-]+/)*[a-z_-]+\.md)#([a-z0-9-]+)")
# In Markdown: ](<relative page>.md#anchor) or ](#anchor), read from the page's own folder.
MD_LINK = re.compile(r"\]\(((?:\.\./|\./|[a-z_-]+/)*[A-Za-z_-]+\.md)?#([a-z0-9-]+)\)")
# Any relative Markdown link target (not a URL, not an in-page anchor).
MD_TARGET = re.compile(r"\]\((?![a-z]+:|#)([^)\s]+)\)")


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


def _pages_over(limit: int, docs: Path) -> list[str]:
    """Docs pages longer than `limit` words, counted as `wc -w` counts them."""
    return [
        f"{page.relative_to(docs)}: {words} words"
        for page in sorted(docs.rglob("*.md"))
        if (words := len(page.read_text().split())) > limit
    ]


def test_nothing_points_outside_the_repository() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _project_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    for path in _project_files():
        if path.suffix != ".md":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in MD_TARGET.finditer(line):
                target = (path.parent / match.group(1).split("#")[0]).resolve()
                if not target.is_relative_to(ROOT):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)}")
    assert offenders == []


def test_every_link_to_a_docs_section_lands_on_a_heading() -> None:
    anchors = {page.resolve(): _anchors(page) for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]}
    broken = []
    for path in _project_files():
        in_docs = path.is_relative_to(DOCS) and path.suffix == ".md"
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            links = [((DOCS / m.group(1)).resolve(), m.group(2), m.group(0)) for m in CODE_LINK.finditer(line)]
            if in_docs:
                links += [
                    ((path.parent / m.group(1)).resolve() if m.group(1) else path.resolve(), m.group(2), m.group(0))
                    for m in MD_LINK.finditer(line)
                ]
            for page, anchor, link in links:
                if anchor not in anchors.get(page, set()):
                    broken.append(f"{path.relative_to(ROOT)}:{number}: {link}")
    assert broken == []


def test_no_docs_page_is_longer_than_a_sitting() -> None:
    assert _pages_over(MAX_WORDS, DOCS) == []


def test_the_length_check_finds_a_long_page(tmp_path: Path) -> None:
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "long.md").write_text("word " * (MAX_WORDS + 1))
    (tmp_path / "short.md").write_text("word " * MAX_WORDS)
    assert _pages_over(MAX_WORDS, tmp_path) == [f"guide/long.md: {MAX_WORDS + 1} words"]


def _missing_targets(root: Path) -> list[str]:
    """Relative links in Markdown pages (README and docs) whose file does not exist."""
    missing = []
    for path in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        if not path.exists():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in MD_TARGET.finditer(line):
                target = match.group(1).split("#")[0]
                if target and "://" not in target and not (path.parent / target).exists():
                    missing.append(f"{path.relative_to(root)}:{number}: {target}")
    return missing


def test_every_linked_page_exists() -> None:
    assert _missing_targets(ROOT) == []


def test_the_link_check_finds_a_missing_page(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[there](docs/there.md) and [gone](docs/" + "gone.md#x)\n")
    (tmp_path / "docs" / "there.md").write_text("# There\n")
    assert _missing_targets(tmp_path) == ["README.md:1: docs/gone.md"]
