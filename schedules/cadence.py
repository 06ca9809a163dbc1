"""When a schedule is due: a 5-field cron expression in a time zone, or a fixed interval.

Times are stored in UTC; cron expressions are evaluated on the wall clock of the schedule's
zone, so "30 2 * * *" in Europe/Berlin means half past two local time all year round.

Daylight-saving rules (the ones ISC/Vixie cron follows, which owners expect):

- spring forward: a wall time that does not exist that day (02:30 when clocks jump from 02:00
  to 03:00) fires once, at the moment the gap ends (03:00 local);
- fall back: a job with a fixed hour fires once, not again when the same wall time comes round a
  second time; a job whose hour field is a wildcard ("*/30 * * * *") follows real elapsed time
  and fires in both copies of the repeated hour.

An interval is elapsed time: "every 3600 seconds" stays 3600 seconds apart across DST changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

from boxsite.core.errors import InvalidRequest
from boxsite.core.validation import time_zone_named

MIN_INTERVAL_SECONDS = 60
MAX_INTERVAL_SECONDS = 366 * 24 * 3600
# Counting the occurrences a long outage skipped is bounded: beyond this the count is reported
# as "at least" and the cursor jumps straight to the next future occurrence.
MAX_COUNTED_OCCURRENCES = 10_000


@dataclass(frozen=True)
class Catchup:
    """What a firing at ``now`` owes: ``due`` occurrences (1 = on time), and where to go next."""

    due: int
    next_run_at: datetime
    capped: bool = False

    @property
    def skipped(self) -> int:
        return self.due - 1


@dataclass(frozen=True)
class Cadence:
    cron: str = ""
    timezone: str = "UTC"
    interval_seconds: int | None = None

    @classmethod
    def parse(cls, cron: str | None, tz: str | None, interval_seconds: object) -> Cadence:
        """A checked cadence, or ``InvalidRequest`` naming the field that is wrong."""
        if cron and interval_seconds is not None:
            raise InvalidRequest("give 'cron' or 'intervalSeconds', not both", field="cron")
        if not cron and interval_seconds is None:
            raise InvalidRequest("a schedule needs 'cron' (5 fields) or 'intervalSeconds'", field="cron")
        if interval_seconds is not None:
            if isinstance(interval_seconds, bool) or not isinstance(interval_seconds, int):
                raise InvalidRequest("'intervalSeconds' must be a whole number", field="intervalSeconds")
            if not MIN_INTERVAL_SECONDS <= interval_seconds <= MAX_INTERVAL_SECONDS:
                raise InvalidRequest(
                    f"'intervalSeconds' must be between {MIN_INTERVAL_SECONDS} and {MAX_INTERVAL_SECONDS}",
                    field="intervalSeconds",
                )
            if tz not in (None, "", "UTC"):
                raise InvalidRequest("'timezone' applies to cron schedules only; an interval is elapsed time", field="timezone")
            return cls(interval_seconds=interval_seconds)
        assert cron is not None
        if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
            raise InvalidRequest(f"'{cron}' is not a 5-field cron expression (minute hour day month weekday)", field="cron")
        zone = tz or "UTC"
        if time_zone_named(zone) is None:
            raise InvalidRequest(f"unknown time zone '{zone}'", field="timezone")
        cadence = cls(cron=" ".join(cron.split()), timezone=zone)
        try:
            cadence.next_after(datetime.now(UTC))
        except CroniterBadDateError as exc:  # "0 0 30 2 *": a day no month has
            raise InvalidRequest(f"'{cron}' never comes (no date matches it)", field="cron") from exc
        return cadence

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def _fixed_hour(self) -> bool:
        return "*" not in self.cron.split()[1]

    def next_after(self, instant: datetime) -> datetime:
        """The first occurrence strictly after ``instant`` (an occurrence or any moment), in UTC."""
        if self.interval_seconds is not None:
            return instant + timedelta(seconds=self.interval_seconds)
        local = instant.astimezone(self.zone)
        it = croniter(self.cron, local)
        candidate: datetime = it.get_next(datetime)
        # Fall back: the same wall-clock time again (an hour later in real time) is a repeat,
        # not a new occurrence, for jobs pinned to an hour.
        while (
            self._fixed_hour()
            and candidate.utcoffset() != local.utcoffset()
            and candidate.replace(tzinfo=None) <= local.replace(tzinfo=None)
        ):
            candidate = it.get_next(datetime)
        return candidate.astimezone(UTC)

    def first_after(self, now: datetime) -> datetime:
        """Where a new (or resumed) schedule's cursor starts."""
        return self.next_after(now)

    def catch_up(self, cursor: datetime, now: datetime) -> Catchup:
        """Occurrences from ``cursor`` (due, <= ``now``) up to now coalesce into one firing."""
        if self.interval_seconds is not None:
            step = self.interval_seconds
            behind = int((now - cursor).total_seconds() // step)
            due = behind + 1
            return Catchup(due=due, next_run_at=cursor + timedelta(seconds=step * due))
        due = 1
        nxt = self.next_after(cursor)
        while nxt <= now:
            if due >= MAX_COUNTED_OCCURRENCES:
                return Catchup(due=due, next_run_at=self.next_after(now), capped=True)
            due += 1
            nxt = self.next_after(nxt)
        return Catchup(due=due, next_run_at=nxt)

    def describe(self) -> str:
        if self.interval_seconds is not None:
            return f"every {self.interval_seconds} seconds"
        return f"cron '{self.cron}' ({self.timezone})"
