"""Values in a flow: ``${name}`` filled in at the moment a step executes, and passed to a shell
as data, never as code."""
from __future__ import annotations

import re
from typing import Any

_NAME = re.compile(r"\$\{([^}]+)\}")


def substitute(value: Any, values: dict[str, Any]) -> Any:
    """Replace ``${name}`` with its value; called only at the moment a step executes."""
    if isinstance(value, str):
        return _NAME.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), value)
    if isinstance(value, dict):
        return {k: substitute(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, values) for v in value]
    return value


SHELL_VALUE_PREFIX = "BOX_VALUE_"


def shell_command(cmd: str, values: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """``cmd`` with each ``${name}`` turned into a reference to an environment variable holding
    the value, and those variables: a value reaches the shell as data, never as code.

    The reference fits where the name stands, so the value arrives as one literal word: unquoted
    it becomes ``"$BOX_VALUE_n"``, inside double quotes ``${BOX_VALUE_n}``, inside single quotes
    the quotes are closed around it (``'"$BOX_VALUE_n"'``). Expansion results are never parsed
    again by the shell, so ``$(...)``, backquotes and ``;`` in a value stay text.
    """
    out: list[str] = []
    env: dict[str, str] = {}
    by_name: dict[str, str] = {}
    quote = ""  # "", "'" or '"': the shell's quoting state at this point of the command
    i = 0
    while i < len(cmd):
        char = cmd[i]
        match = _NAME.match(cmd, i) if char == "$" else None
        if match and match.group(1) in values:
            name = match.group(1)
            if name not in by_name:
                by_name[name] = f"{SHELL_VALUE_PREFIX}{len(by_name) + 1}"
                env[by_name[name]] = str(values[name])
            var = by_name[name]
            out.append({"": f'"${{{var}}}"', '"': f"${{{var}}}", "'": f"'\"${{{var}}}\"'"}[quote])
            i = match.end()
            continue
        if char == "\\" and quote != "'" and i + 1 < len(cmd):
            out.append(cmd[i:i + 2])
            i += 2
            continue
        if char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        out.append(char)
        i += 1
    return "".join(out), env
