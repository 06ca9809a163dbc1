"""This machine's own names and addresses, for the hosts a box listening beyond loopback answers.

With ``BOX_HOST=0.0.0.0`` a phone on the network opens the box by the machine's address (or a
name the network gives it); Django refuses any Host it was not told of, so the box tells it every
name and address this machine has at start: its hostname and fully qualified name, what those
resolve to, and the addresses of its interfaces (read from /proc/net, IPv4 and IPv6).
"""
from __future__ import annotations

import ipaddress
import logging
import socket
from pathlib import Path

_WILDCARDS = {"0.0.0.0", "::", "[::]", ""}


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in {"localhost", "ip6-localhost", "ip6-loopback"} or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listens_wide(host: str) -> bool:
    """True when a box bound to ``host`` is reachable from other machines."""
    return host.strip("[]") in _WILDCARDS or not is_loopback(host)


def _interface_addresses() -> list[str]:
    """Every local address of this machine's interfaces: IPv4 from the kernel's local routing
    table (entries marked ``host LOCAL``), IPv6 from the interface list."""
    found: list[str] = []
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    for line, following in zip(lines, lines[1:]):
        if line.strip().startswith("|--") and "host LOCAL" in following:
            found.append(line.strip()[3:].strip())
    try:
        for row in Path("/proc/net/if_inet6").read_text().splitlines():
            hexed = row.split()[0]
            found.append(str(ipaddress.IPv6Address(int(hexed, 16))))
    except (OSError, ValueError, IndexError):
        pass
    return found


def _resolved(name: str) -> list[str]:
    try:
        return [str(info[4][0]).split("%")[0] for info in socket.getaddrinfo(name, None)]
    except (OSError, UnicodeError):
        return []


def own_addresses() -> list[str]:
    """This machine's non-loopback addresses, IPv4 first (the ones a phone is likeliest to use)."""
    names = {socket.gethostname(), socket.getfqdn()}
    candidates = _interface_addresses() + [address for name in sorted(names) for address in _resolved(name)]
    addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for text in candidates:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        if not (address.is_loopback or address.is_unspecified) and address not in addresses:
            addresses.append(address)
    addresses.sort(key=lambda a: (a.version, a.is_link_local))
    return [str(a) for a in addresses]


def as_host(address: str) -> str:
    """``address`` as it appears in a Host header (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def own_hosts() -> list[str]:
    """Every Host header that names this machine: its names and its non-loopback addresses."""
    hosts = [name.lower() for name in (socket.gethostname(), socket.getfqdn()) if name and not is_loopback(name)]
    hosts += [as_host(address) for address in own_addresses()]
    return list(dict.fromkeys(hosts))


class AllowedHostsHint(logging.Filter):
    """Adds to Django's "Invalid HTTP_HOST header" line the box's own setting to change."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "BOX_ALLOWED_HOSTS" not in record.msg:
            record.msg += (" (the box answers the names and addresses of this machine when BOX_HOST is not "
                           "loopback, and BOX_PUBLIC_URL's host; add other names to BOX_ALLOWED_HOSTS, "
                           "comma-separated, which then replaces the defaults)")
        return True
