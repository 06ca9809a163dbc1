"""Event recorded -> WebSocket client receives it (p50/p95), embedded polling and Redis.

Runs a real box (daphne + qcluster + scheduler) per transport, pairs a phone to get a device
cookie, opens /ws/tasks/<id>/ as that phone over a plain TCP WebSocket, and appends events to a
waiting task through the action log's one writer (``record_event``, in this process, against the
box's database). Latency is measured from the moment the event's transaction commits (the event
is recorded) to the frame arriving; the write itself is shown beside it. Beside it, the nearest floors: half the poll interval
(polling's expected wait) and a bare Redis PUBLISH -> SUBSCRIBE round trip.
Usage: .venv/bin/python bench/live.py [--events N]
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import struct
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import BenchBox, percentile, stop_on_signals  # noqa: E402

POLL_S = 0.1  # BOX_LIVE_POLL_SECONDS, the embedded default


class TinyWebSocket:
    """Just enough of RFC 6455 to read text frames from the box (the box never needs us to send)."""

    def __init__(self, host: str, port: int, path: str, cookie: str) -> None:
        self.sock = socket.create_connection((host, port))
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://{host}:{port}\r\n"
                   f"Cookie: {cookie}\r\n\r\n")
        self.sock.sendall(request.encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(4096)
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError(f"the box refused the stream: {head[:200]!r}")

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("stream closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def frame(self) -> dict[str, Any]:
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack("!H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._read(8))[0]
            payload = self._read(length)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError("stream closed by the box")
            if opcode == 0x1:
                return json.loads(payload)

    def close(self) -> None:
        self.sock.close()


def csrf_cookie(box: BenchBox) -> str:
    """A CSRF token, as a browser gets one from any page with a form."""
    with urllib.request.urlopen(f"http://127.0.0.1:{box.port}/pair") as response:
        header = next(v for k, v in response.headers.items() if k.lower() == "set-cookie" and v.startswith("csrftoken="))
    return header.split(";", 1)[0].split("=", 1)[1]


def device_cookie(box: BenchBox) -> str:
    code = box.post("/api/pairing", {})["code"]
    req = urllib.request.Request(f"http://127.0.0.1:{box.port}/api/pairing/claim", method="POST",
                                 data=json.dumps({"code": code, "name": "bench"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as response:
        header = response.headers["Set-Cookie"]
    return header.split(";", 1)[0]


def use_box_database(box: BenchBox) -> None:
    """Point this process's Django at the bench box's database (and Redis), to write events."""
    for key in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(key, None)
    os.environ.update({k: v for k, v in box.env.items() if k.startswith(("BOX_", "DATABASE_URL", "REDIS_URL"))})
    os.environ["DJANGO_SETTINGS_MODULE"] = "boxsite.settings"
    import django

    django.setup()


def measure(box: BenchBox, n: int) -> tuple[list[float], list[float]]:
    from django.db import close_old_connections, transaction

    from tasks.events import record_event
    from tasks.models import Task

    phone = device_cookie(box)
    csrf = csrf_cookie(box)
    # A task the phone asked for, waiting for a value: it stays open while events are appended.
    req = urllib.request.Request(f"http://127.0.0.1:{box.port}/api/tasks", method="POST",
                                 data=json.dumps({"title": "live bench", "flow": {"steps": [{"write": {"path": "a", "content": "${x}"}}]}}).encode(),
                                 headers={"Content-Type": "application/json", "Cookie": f"{phone}; csrftoken={csrf}",
                                          "X-CSRFToken": csrf})
    with urllib.request.urlopen(req) as response:
        task_id = json.loads(response.read())["id"]
    close_old_connections()
    deadline = time.monotonic() + 30
    while Task.objects.get(pk=task_id).state != "waiting":
        if time.monotonic() > deadline:
            raise RuntimeError("the bench task never reached waiting")
        time.sleep(0.02)
    task = Task.objects.get(pk=task_id)
    ws = TinyWebSocket("127.0.0.1", box.port, f"/ws/tasks/{task_id}/?after={task.event_seq}", phone)
    while ws.frame()["type"] != "ready":
        pass
    latencies: list[float] = []
    writes: list[float] = []
    for i in range(n):
        committed: list[float] = []
        started = time.perf_counter()
        with transaction.atomic():
            # Registered first, so it runs at the commit, before the publisher's own callback.
            transaction.on_commit(lambda: committed.append(time.perf_counter()))
            record_event(task, "note", f"bench event {i}")
        writes.append((committed[0] - started) * 1000)
        while True:
            frame = ws.frame()
            if frame["type"] == "event" and frame["event"]["summary"] == f"bench event {i}":
                latencies.append((time.perf_counter() - committed[0]) * 1000)
                break
        # Spread the writes over the poll cycle, as real events are.
        time.sleep(0.013 * (i % 7 + 1))
    ws.close()
    return latencies, writes


def redis_floor(url: str, n: int) -> list[float]:
    import redis

    client = redis.Redis.from_url(url)
    pubsub = client.pubsub()
    pubsub.subscribe("box-bench-floor")
    pubsub.get_message(timeout=1)
    out = []
    for _ in range(n):
        started = time.perf_counter()
        client.publish("box-bench-floor", b"x")
        while pubsub.get_message(timeout=1) is None:
            pass
        out.append((time.perf_counter() - started) * 1000)
    pubsub.close()
    return out


TRANSPORTS = {
    "polling": ("embedded (SQLite, polling)", {}, 500.0),
    "redis": ("PostgreSQL + Redis", {"postgres": True, "redis": True}, 50.0),
}


def run_one(transport: str, n: int) -> None:
    """Measure one transport in this process (Django is set up once per process)."""
    _, options, _ = TRANSPORTS[transport]
    with BenchBox(extra_env={"BOX_LIVE_POLL_SECONDS": str(POLL_S)}, **options) as box:  # type: ignore[arg-type]
        use_box_database(box)
        values, writes = measure(box, n)
        floor = [POLL_S * 500] if transport == "polling" else redis_floor(box.env["REDIS_URL"], n)
    print(json.dumps({"values": values, "writes": writes, "floor": floor}))


def measure_in_child(transport: str, n: int) -> str:
    """Run one transport in a child process; if this bench is stopped, the child is asked to stop
    too (SIGTERM, which it turns into a clean shutdown of its box) rather than killed."""
    import subprocess

    stop_on_signals()
    child = subprocess.Popen([sys.executable, __file__, "--transport", transport, "--events", str(n)],
                             stdout=subprocess.PIPE, text=True)
    try:
        out, _ = child.communicate()
    except BaseException:
        child.terminate()
        child.wait()
        raise
    if child.returncode != 0:
        raise RuntimeError(f"the {transport} measurement failed ({child.returncode})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--transport", choices=sorted(TRANSPORTS))
    args = parser.parse_args()
    if args.transport:
        run_one(args.transport, args.events)
        return
    print(f"\nevent recorded -> WebSocket client receives it ({args.events} events each)\n")
    print("measured from the event's commit to the frame arriving; 'write' is record_event's own transaction\n")
    print(f"{'transport':<28} {'p50 ms':>8} {'p95 ms':>8} {'target p50':>11} {'write p50':>10}  nearest floor (same run)")
    for transport, (name, _, target) in TRANSPORTS.items():
        result = json.loads(measure_in_child(transport, args.events).strip().splitlines()[-1])
        values, floor = result["values"], result["floor"]
        floor_text = f"poll interval / 2 = {floor[0]:.0f} ms" if transport == "polling" else \
            f"bare Redis PUBLISH->SUBSCRIBE p50 {percentile(floor, 50):.2f} ms"
        print(f"{name:<28} {percentile(values, 50):>8.1f} {percentile(values, 95):>8.1f} {'<= %.0f' % target:>11} "
              f"{percentile(result['writes'], 50):>10.1f}  {floor_text}")


if __name__ == "__main__":
    main()
