"""``GET /metrics``: the box in the Prometheus text format, for an API token.

Each scrape builds its own registry from the database: the web process, the worker cluster and
the scheduler are separate processes, so counters kept in one process's memory would show only
what that process saw (and restart at zero with it). The latency histograms cover the steps and
model calls logged in the last ``BOX_METRICS_WINDOW_S`` seconds, read from the action log."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from rest_framework import exceptions

from boxsite.core import procs
from boxsite.core.auth import BearerTokenAuthentication
from boxsite.models import ApiToken
from tasks.models import EventKind, Run, RunState, Task, TaskEvent
from tasks.states import State

# The names Chromium's processes go by (/proc/<pid>/comm, cut at 15 characters): Debian's
# build, Google's, and Playwright's headless shell.
BROWSER_NAMES = frozenset({"chromium", "chrome", "chrome-headless", "headless_shell"})
BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# The most log lines one scrape reads per histogram: a busy hour cannot make a scrape slow.
MAX_SAMPLES = 20_000


def collect() -> CollectorRegistry:
    """A fresh registry holding the box's figures as the database has them now."""
    registry = CollectorRegistry(auto_describe=False)
    tasks = Gauge("box_tasks", "Tasks by state", ["state"], registry=registry)
    counted = dict(_count_by(Task.objects.all()))
    for state in State.values:
        tasks.labels(state).set(counted.get(state, 0))
    runs = Gauge("box_runs", "Runs by state", ["state"], registry=registry)
    counted = dict(_count_by(Run.objects.all()))
    for state in RunState.values:
        runs.labels(state).set(counted.get(state, 0))
    Gauge("box_queue_depth", "Runs queued and not yet claimed by a worker",
          registry=registry).set(counted.get(RunState.QUEUED, 0))
    cost = Task.objects.aggregate(total=Sum("cost_cents"))["total"] or 0
    Counter("box_cost_cents", "Cost of every task's model calls and paid steps, in cents",
            registry=registry).inc(cost)
    Counter("box_sandbox_starts", "Runs started (each one a sandbox started for its task)",
            registry=registry).inc(Run.objects.filter(started_at__isnull=False).count())
    Gauge("box_browser_processes", "Live Chromium processes on this machine",
          registry=registry).set(procs.count_named(BROWSER_NAMES))
    _latencies(registry)
    return registry


def _count_by(queryset: Any) -> list[tuple[str, int]]:
    return list(queryset.order_by().values("state").annotate(n=Count("pk")).values_list("state", "n"))


def _latencies(registry: CollectorRegistry) -> None:
    since = timezone.now() - timedelta(seconds=settings.BOX_METRICS_WINDOW_S)
    results = TaskEvent.objects.filter(kind=EventKind.STEP_RESULT, created_at__gte=since).order_by("-id")
    steps = Histogram("box_step_duration_seconds", "How long steps took (those logged within the window)",
                      buckets=BUCKETS_S, registry=registry)
    for ms in results.values_list("data__durationMs", flat=True)[:MAX_SAMPLES]:
        if isinstance(ms, int | float):
            steps.observe(ms / 1000)
    calls = Histogram("box_model_call_seconds", "How long model calls took to answer (within the window)",
                      buckets=BUCKETS_S, registry=registry)
    for ms in results.filter(data__kind="model").values_list("data__decision__latencyMs", flat=True)[:MAX_SAMPLES]:
        if isinstance(ms, int | float):
            calls.observe(ms / 1000)


def metrics(request: HttpRequest) -> HttpResponse:
    """The scrape. An API token only (a paired phone's cookie or token is no operator's), and
    401 in the API's error shape without one."""
    try:
        found = BearerTokenAuthentication().authenticate(request)
    except exceptions.AuthenticationFailed as exc:
        found, reason = None, str(exc.detail)
    else:
        reason = "send 'Authorization: Bearer <API token>'"
    if found is None or not isinstance(found[1], ApiToken):
        response = JsonResponse({"code": "UNAUTHENTICATED", "message": reason, "field": None}, status=401)
        response["WWW-Authenticate"] = "Bearer"
        return response
    if request.method not in ("GET", "HEAD"):
        return JsonResponse({"code": "METHOD_NOT_ALLOWED", "message": f"{request.method} is not allowed here",
                             "field": None}, status=405)
    return HttpResponse(generate_latest(collect()), content_type=CONTENT_TYPE_LATEST)
