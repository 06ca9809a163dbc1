from __future__ import annotations

import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from boxsite import scheduler
from boxsite.core.beats import Beat


class Command(BaseCommand):
    help = "Run the scheduler loop: reap expired leases, dispatch due runs, fire schedules."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="run one tick and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        pending = scheduler.start_phases()
        beat = Beat("scheduler")  # after each tick: a wedged tick goes stale in /api/health
        while True:
            if pending:  # a start-up phase a database fault failed: again, before the tick
                pending = scheduler.run_phases(pending)
            scheduler.tick()
            beat.due()
            if options["once"] or stop.wait(settings.BOX_SCHEDULER_TICK_SECONDS):
                break
