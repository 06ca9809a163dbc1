"""Every environment variable the box reads is on docs/reference/settings.md, and every variable
that page lists is still read somewhere. The code is read as Python (its syntax tree), so a call
split over lines or a new reader in any module is found."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "settings.md"
CODE = ["boxsite", "tasks", "approvals", "schedules", "manage.py"]
# The readers of boxsite.core.env and the standard library's.
READERS = {"env_str", "env_bool", "env_float", "env_int", "env_list", "env_path", "env_url", "getenv"}
# The system's own, passed through to processes the box starts: not the box's settings.
SYSTEM = {"PATH", "HOME", "LANG", "TERM"}


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name) and node.id == "environ")


def variables_read(source: str) -> set[str]:
    """Names read from the environment in ``source``: ``env_*("X")``, ``os.getenv("X")``,
    ``os.environ.get("X")``, ``os.environ["X"]`` and ``"X" in os.environ``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in READERS or (name == "get" and isinstance(func, ast.Attribute) and _is_environ(func.value)):
                found.add(node.args[0].value)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            if isinstance(node.slice, ast.Constant):
                found.add(node.slice.value)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and any(
                isinstance(op, ast.In) for op in node.ops) and any(_is_environ(c) for c in node.comparators):
            found.add(node.left.value)
    return {name for name in found if isinstance(name, str)} - SYSTEM


def code_variables() -> dict[str, str]:
    """Each variable the project's code reads, with one file that reads it."""
    where: dict[str, str] = {}
    for root in CODE:
        path = ROOT / root
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            if "migrations" in file.parts:
                continue
            for name in variables_read(file.read_text()):
                where.setdefault(name, str(file.relative_to(ROOT)))
    return where


def page_variables(text: str) -> set[str]:
    """The variables in the first column of the page's tables."""
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", text, flags=re.MULTILINE))


def undocumented(code: dict[str, str], page: set[str]) -> list[str]:
    return sorted(f"{name} (read in {code[name]})" for name in code.keys() - page)


def test_every_variable_the_code_reads_is_documented() -> None:
    missing = undocumented(code_variables(), page_variables(PAGE.read_text()))
    assert missing == [], f"add these to {PAGE.relative_to(ROOT)}: {missing}"


def test_every_documented_variable_is_still_read() -> None:
    stale = sorted(page_variables(PAGE.read_text()) - code_variables().keys())
    assert stale == [], f"{PAGE.relative_to(ROOT)} lists variables nothing reads: {stale}"


def test_a_new_variable_read_anywhere_fails_the_check() -> None:
    """The check itself: a module reading a variable the page lacks, in each way code reads one."""
    source = ('import os\nfrom boxsite.core.env import env_int\n'
              'A = env_int(\n    "BOX_NEW_KNOB", 3)\nB = os.environ.get("BOX_OTHER")\nC = os.environ["BOX_THIRD"]\n'
              'D = "BOX_FOURTH" in os.environ\nE = os.getenv("PATH")\n')
    code = {name: "new.py" for name in variables_read(source)}
    page = page_variables(PAGE.read_text())
    assert undocumented(code, page) == [f"{name} (read in new.py)" for name in
                                        ("BOX_FOURTH", "BOX_NEW_KNOB", "BOX_OTHER", "BOX_THIRD")]


def _setting(name: str, env: dict[str, str]) -> str:
    script = f"import django; django.setup(); from django.conf import settings; print(settings.{name})"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("BOX_TRUSTED")},
                               "DJANGO_SETTINGS_MODULE": "boxsite.settings", **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_proxy_s_https_header_is_trusted_only_when_told() -> None:
    assert _setting("SECURE_PROXY_SSL_HEADER", {}) == "None"
    assert _setting("SECURE_PROXY_SSL_HEADER", {"BOX_TRUSTED_PROXY": "1"}) == "('HTTP_X_FORWARDED_PROTO', 'https')"


def test_the_shipped_environment_file_names_only_settings_the_box_reads() -> None:
    """``deploy/box.env.example``, commented-out lines included: a misspelt name there would be
    taken and ignored."""
    text = (ROOT / "deploy" / "box.env.example").read_text()
    named = set(re.findall(r"^#?\s?([A-Z][A-Z0-9_]*)=", text, flags=re.MULTILINE))
    assert named, "the environment file names no setting"
    assert sorted(named - page_variables(PAGE.read_text())) == []
