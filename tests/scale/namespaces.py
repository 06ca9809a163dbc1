"""Simulated machines on one host: each in a network namespace and a mount namespace of its own.

A machine is a ``sleep`` holding the two namespaces (``unshare --net --mount``, private mount
propagation), into which its box processes are started with ``nsenter``. What it sees:

- **Network**: its own loopback, a veth pair to the host (the host side is ``10.231.<n>.1``, the
  machine ``10.231.<n>.2``), and one veth pair per other machine (``10.232.<pair>.<i>``), which
  is how their web processes reach each other. PostgreSQL and Redis listen on the host's
  loopback only: a ``socat`` relay on the host's side of each machine's veth forwards to them,
  so a machine reaches the database and queue and nothing else of the host's loopback (the
  queue's wake-up sockets, the other machine's abstract sockets, its web port).
- **Disk**: its data directory is ``<tmp>/machine-<name>``, bound there inside its mount
  namespace from ``<tmp>/disks/<name>``, and ``<tmp>/disks`` is covered by an empty tmpfs: no
  machine sees another's data directory, and the host (the test) sees neither at the paths the
  machines use. The two paths differ so that each machine's pool of task users (accounts in the
  host's ``/etc/passwd``, which the machines share as they share the kernel) carries its own mark.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]  # the checkout: where the machines' processes start


def available() -> str | None:
    """None when this host can simulate machines; else why not."""
    if os.geteuid() != 0:
        return "needs root (unshare, nsenter, veth pairs)"
    for tool in ("unshare", "nsenter", "ip", "socat", "tar"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


def _run(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=30)


@dataclass
class Machine:
    name: str
    index: int
    holder: subprocess.Popen[bytes]
    data_dir: Path
    disk: Path
    peers: dict[str, str] = field(default_factory=dict)  # other machine -> the address it reaches this one at

    @property
    def pid(self) -> int:
        return self.holder.pid

    @property
    def host_side(self) -> str:
        return f"10.231.{self.index}.1"

    @property
    def address(self) -> str:
        """Where the host (the test) reaches this machine."""
        return f"10.231.{self.index}.2"

    def enter(self) -> list[str]:
        """The prefix that starts a command inside this machine."""
        # --wd: entering a mount namespace leaves the working directory at its root otherwise.
        return ["nsenter", "-t", str(self.pid), "-n", "-m", f"--wd={ROOT}", "--"]

    def run(self, *argv: str) -> None:
        _run(*self.enter(), *argv)

    def read(self, *argv: str) -> str:
        return subprocess.run([*self.enter(), *argv], check=True, capture_output=True, timeout=30, text=True).stdout


def _veth(tag: str) -> tuple[str, str]:
    # Interface names are at most 15 bytes; the pid keeps two test runs apart.
    stem = f"bx{os.getpid() % 100000}{tag}"
    return f"{stem}0", f"{stem}1"


@contextmanager
def machines(tmp_path: Path, names: list[str], relayed_ports: list[int]) -> Iterator[dict[str, Machine]]:
    """Start the machines (namespaces, network, disks, relays); tear everything down after."""
    found: dict[str, Machine] = {}
    relays: list[subprocess.Popen[bytes]] = []
    with ExitStack() as undo:
        for index, name in enumerate(names, start=1):
            holder = subprocess.Popen(["unshare", "--net", "--mount", "--propagation", "private", "--",
                                       "sleep", "infinity"], start_new_session=True)
            undo.callback(_end, holder)
            disk = tmp_path / "disks" / name
            data_dir = tmp_path / f"machine-{name}"
            disk.mkdir(parents=True)
            data_dir.mkdir()
            machine = found[name] = Machine(name, index, holder, data_dir, disk)
            _wait_for_namespaces(holder.pid)
            host_end, machine_end = _veth(name)
            _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", machine_end)
            _run("ip", "link", "set", machine_end, "netns", str(holder.pid))
            _run("ip", "addr", "add", f"{machine.host_side}/24", "dev", host_end)
            _run("ip", "link", "set", host_end, "up")
            machine.run("ip", "link", "set", "lo", "up")
            machine.run("ip", "addr", "add", f"{machine.address}/24", "dev", machine_end)
            machine.run("ip", "link", "set", machine_end, "up")
            for port in relayed_ports:
                relays.append(subprocess.Popen(
                    ["socat", f"TCP-LISTEN:{port},bind={machine.host_side},fork,reuseaddr", f"TCP:127.0.0.1:{port}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
            machine.run("mount", "--bind", str(disk), str(data_dir))
            machine.run("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "none", str(tmp_path / "disks"))
        undo.callback(lambda: [_end(relay) for relay in relays])
        ordered = list(found.values())
        for pair, (one, other) in enumerate(((a, b) for i, a in enumerate(ordered) for b in ordered[i + 1:]), start=1):
            end_one, end_other = _veth(f"{one.name[0]}{other.name[0]}")
            _run("ip", "link", "add", end_one, "type", "veth", "peer", "name", end_other)
            _run("ip", "link", "set", end_one, "netns", str(one.pid))
            _run("ip", "link", "set", end_other, "netns", str(other.pid))
            for machine, end, host in ((one, end_one, 1), (other, end_other, 2)):
                machine.run("ip", "addr", "add", f"10.232.{pair}.{host}/24", "dev", end)
                machine.run("ip", "link", "set", end, "up")
            other.peers[one.name] = f"10.232.{pair}.1"
            one.peers[other.name] = f"10.232.{pair}.2"
        yield found


def _wait_for_namespaces(pid: int) -> None:
    """``unshare`` has made its namespaces once its process runs ``sleep`` (its net namespace
    differs from ours)."""
    own = os.readlink("/proc/self/ns/net")

    def made() -> bool:
        try:
            return os.readlink(f"/proc/{pid}/ns/net") != own and Path(f"/proc/{pid}/exe").resolve().name == "sleep"
        except OSError:
            return False

    wait_for(made, timeout=10, what=f"unshare ({pid}) to make its namespaces")


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Its namespaces go with their last process: the veth pairs, the mounts, the tmpfs."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
