"""The owner's Schedules and Triggers pages (docs/guide/portal.md): server-rendered shells that
``static/js/schedules.js`` and ``static/js/triggers.js`` fill from the schedules API. Like every
portal page they only read; each change is an API call. They sit behind ``login_required``, as
settings does: a paired phone holds a device cookie, never a session, so it is sent to sign in."""
from __future__ import annotations

from functools import cache
from zoneinfo import available_timezones

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from boxsite.pages import task_form_choices
from schedules.cadence import MAX_INTERVAL_SECONDS, MIN_INTERVAL_SECONDS
from schedules.triggers import SECRET_MIN_LENGTH


@cache
def time_zones() -> list[str]:
    # The IANA names the API accepts (zoneinfo), offered as suggestions on the time zone field.
    return sorted(zone for zone in available_timezones() if "/" in zone or zone == "UTC")


@login_required
def schedules_page(request: HttpRequest) -> HttpResponse:
    return render(request, "schedules/schedules.html", {
        "active": "schedules", **task_form_choices(), "time_zones": time_zones(),
        "min_interval": MIN_INTERVAL_SECONDS, "max_interval": MAX_INTERVAL_SECONDS,
    })


@login_required
def triggers_page(request: HttpRequest) -> HttpResponse:
    return render(request, "schedules/triggers.html", {
        "active": "triggers", **task_form_choices(), "secret_min": SECRET_MIN_LENGTH,
    })
