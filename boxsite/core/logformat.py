"""Log records as JSON lines (``BOX_LOG_FORMAT=json``), for a log shipper that reads one
object a line: the time in UTC (ISO 8601), the level, the logger, the message with its
arguments filled in, the process, and the traceback when there is one."""
from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # default=str: a message argument that is not JSON (a path, an id object) is still a line
        return json.dumps(line, ensure_ascii=False, default=str)
