"""One line per event, key=value fields, to stderr (journald keeps it as-is).

Values a client chose (request ids, paths, messages) are escaped: a control
character, an escape sequence or a bidirectional override in one would
otherwise reach a terminal or a log viewer as it is, to recolour, rewrite or
reorder what an operator reads. Events a client can cause at will are
rate-limited: the first at once, then one line per period with a count.
"""
import logging
import os
import sys
import time

_QUOTE_WHEN = frozenset("\"'=\\")


def configure_logging(level: str | None = None) -> None:
    level = (level or os.environ.get("JEVANY_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(stream=sys.stderr, level=level,
                        format="%(asctime)s %(levelname)s %(name)s pid=%(process)d %(message)s")


def _value(v) -> str:
    text = str(v)
    # repr() escapes every character that is not printable (controls, ESC, the bidirectional
    # overrides, line and paragraph separators) and quotes the rest, so a value stays one field.
    if not text or not text.isprintable() or any(c.isspace() or c in _QUOTE_WHEN for c in text):
        return repr(text)
    return text


def event(log: logging.Logger, name: str, level: int = logging.INFO, **fields) -> None:
    log.log(level, " ".join([f"event={name}", *(f"{k}={_value(v)}" for k, v in fields.items())]))


class RateLimited:
    """An event that can come thousands of times a second: the first is logged at once, then at
    most one line per period, counting what happened since (count=N)."""

    def __init__(self, log: logging.Logger, name: str, period_s: float, clock, level: int = logging.INFO):
        self.log, self.name, self.period_s, self.clock, self.level = log, name, period_s, clock, level
        self.pending = 0
        self.fields: dict = {}
        self.next_at = float("-inf")

    def hit(self, **fields) -> None:
        self.pending += 1
        self.fields = fields
        self.flush()

    def flush(self) -> None:
        """Log what is pending if the period allows; call it now and then so a burst's tail is told."""
        now = self.clock()
        if self.pending and now >= self.next_at:
            event(self.log, self.name, level=self.level, count=self.pending, **self.fields)
            self.pending = 0
            self.next_at = now + self.period_s


class FloodFilter(logging.Filter):
    """RateLimited for another library's log lines (uvicorn's, one per bad request): each distinct
    message passes once, then at most once per period, saying how many like it were held back."""

    def __init__(self, period_s: float, clock=time.monotonic):
        super().__init__()
        self.period_s, self.clock = period_s, clock
        self.held: dict = {}        # (logger, level, message template) → [next pass time, held back]

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "jevany_summary", False):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        state = self.held.setdefault(key, [float("-inf"), 0])
        if now < state[0]:
            state[1] += 1
            return False
        if state[1]:
            record.msg, record.args = f"{record.getMessage()} ({state[1]} more like it since the last)", None
        state[0], state[1] = now + self.period_s, 0
        return True

    def flush(self) -> None:
        """Tell what was held back once its period is over, though nothing like it came since."""
        now = self.clock()
        for (name, level, message), state in self.held.items():
            if state[1] and now >= state[0]:
                logging.getLogger(name).log(level, "%s (%d more like it since the last)", message, state[1],
                                            extra={"jevany_summary": True})
                state[0], state[1] = now + self.period_s, 0
