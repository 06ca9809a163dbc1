"""When schedules are due, across daylight-saving changes (Europe/Berlin, 2026)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from boxsite.core.errors import InvalidRequest
from schedules.cadence import Cadence


def _occurrences(cadence: Cadence, start: datetime, count: int) -> list[datetime]:
    found, t = [], start
    for _ in range(count):
        t = cadence.next_after(t)
        found.append(t)
    return found


def test_a_daily_half_past_two_fires_once_on_the_spring_forward_day_when_the_gap_ends() -> None:
    cadence = Cadence.parse("30 2 * * *", "Europe/Berlin", None)
    # 29 March 2026: clocks jump from 02:00 CET to 03:00 CEST; 02:30 does not exist.
    runs = _occurrences(cadence, datetime(2026, 3, 28, 12, tzinfo=UTC), 3)
    assert runs == [
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # 03:00 CEST, the moment the gap ends
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2026, 3, 31, 0, 30, tzinfo=UTC),
    ]


def test_a_daily_half_past_two_fires_once_on_the_fall_back_day() -> None:
    cadence = Cadence.parse("30 2 * * *", "Europe/Berlin", None)
    # 25 October 2026: 03:00 CEST becomes 02:00 CET; 02:30 happens twice on the wall clock.
    runs = _occurrences(cadence, datetime(2026, 10, 24, 12, tzinfo=UTC), 3)
    assert runs == [
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST, the first time
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),  # 02:30 CET the next day, not the repeat
        datetime(2026, 10, 27, 1, 30, tzinfo=UTC),
    ]


def test_an_every_thirty_minutes_job_follows_real_time_through_the_repeated_hour() -> None:
    cadence = Cadence.parse("*/30 * * * *", "Europe/Berlin", None)
    runs = _occurrences(cadence, datetime(2026, 10, 24, 23, 45, tzinfo=UTC), 6)
    assert [b - a for a, b in zip(runs, runs[1:])] == [timedelta(minutes=30)] * 5


def test_an_interval_is_elapsed_time_across_a_dst_change() -> None:
    cadence = Cadence.parse(None, None, 3600)
    runs = _occurrences(cadence, datetime(2026, 3, 29, 0, 0, tzinfo=UTC), 4)
    assert [b - a for a, b in zip(runs, runs[1:])] == [timedelta(hours=1)] * 3


def test_missed_occurrences_coalesce_and_the_cursor_moves_to_the_next_future_one() -> None:
    cadence = Cadence.parse("0 * * * *", "Europe/Berlin", None)
    cursor = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)
    catchup = cadence.catch_up(cursor, datetime(2026, 3, 29, 5, 10, tzinfo=UTC))
    assert catchup.due == 6 and catchup.skipped == 5
    assert catchup.next_run_at == datetime(2026, 3, 29, 6, 0, tzinfo=UTC)

    interval = Cadence.parse(None, None, 600)
    catchup = interval.catch_up(cursor, cursor + timedelta(minutes=35))
    assert catchup.skipped == 3 and catchup.next_run_at == cursor + timedelta(minutes=40)


def test_a_very_long_outage_is_counted_up_to_a_bound() -> None:
    cadence = Cadence.parse("* * * * *", "UTC", None)
    cursor = datetime(2025, 1, 1, tzinfo=UTC)
    now = cursor + timedelta(days=60)
    catchup = cadence.catch_up(cursor, now)
    assert catchup.capped and catchup.next_run_at > now and catchup.next_run_at - now <= timedelta(minutes=1)


@pytest.mark.parametrize(("cron", "tz", "interval", "field"), [
    ("30 2 * *", "UTC", None, "cron"),
    ("61 * * * *", "UTC", None, "cron"),
    ("30 2 * * *", "Mars/Olympus", None, "timezone"),
    (None, None, 5, "intervalSeconds"),
    ("* * * * *", None, 60, "cron"),
    (None, None, None, "cron"),
])
def test_it_rejects_a_bad_cadence_naming_the_field(cron: str | None, tz: str | None, interval: int | None, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        Cadence.parse(cron, tz, interval)
    assert caught.value.field == field
