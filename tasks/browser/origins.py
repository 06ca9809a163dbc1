"""``constraints.origins``: the sites a task's browser may open pages on.

An entry is an origin (``https://shop.example``, ``http://127.0.0.1:8080``), a host name with an
optional port (``shop.example``, any scheme), ``*.example`` (the domain and its subdomains) or
``*`` (any site). Empty or absent: any site. Only pages (documents, frames included) are checked,
never what a page loads. Card details are typed only on a page whose origin an entry *names*:
``*`` and ``*.domain`` admit pages but name no site for that.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

_NOT_SITES = ("about", "data", "blob", "chrome-error")  # not a site: nothing to refuse


def allowed_list(constraints: dict[str, Any]) -> list[str]:
    return [str(o).strip().lower() for o in constraints.get("origins") or [] if str(o).strip()]


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    if not parts.scheme or parts.scheme in _NOT_SITES:
        return parts.scheme or url
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}".lower()


def _default_port(scheme: str) -> int | None:
    return {"http": 80, "https": 443}.get(scheme)


def _matches(entry: str, url: str, *, naming: bool) -> bool:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or _default_port(parts.scheme)
    except ValueError:
        return False
    if entry == "*":
        return not naming
    if entry.startswith("*."):
        return not naming and (host == entry[2:] or host.endswith(entry[1:]))
    if "://" in entry:
        want = urlsplit(entry)
        try:
            want_port = want.port or _default_port(want.scheme)
        except ValueError:
            return False
        return want.scheme == parts.scheme and (want.hostname or "") == host and want_port == port
    name, _, want_port_text = entry.partition(":") if entry.count(":") == 1 else (entry, "", "")
    if name.strip("[]") != host:
        return False
    return not want_port_text or (want_port_text.isdigit() and int(want_port_text) == port)


def allowed(url: str, constraints: dict[str, Any]) -> bool:
    """May the task's browser open a page at ``url``?"""
    entries = allowed_list(constraints)
    if not entries or urlsplit(url).scheme in _NOT_SITES:
        return True
    return any(_matches(entry, url, naming=False) for entry in entries)


def named(url: str, constraints: dict[str, Any]) -> bool:
    """Does an entry name this page's site (not merely admit it with ``*``)? Card details are
    typed only there."""
    return any(_matches(entry, url, naming=True) for entry in allowed_list(constraints))
