"""One line per event, key=value fields, to stderr (journald keeps it as-is)."""
import logging
import os
import sys


def configure_logging(level: str | None = None) -> None:
    level = (level or os.environ.get("JEVANY_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(stream=sys.stderr, level=level,
                        format="%(asctime)s %(levelname)s %(name)s pid=%(process)d %(message)s")


def _value(v) -> str:
    text = str(v)
    return repr(text) if (not text or any(c.isspace() or c in "\"'=" for c in text)) else text


def event(log: logging.Logger, name: str, level: int = logging.INFO, **fields) -> None:
    log.log(level, " ".join([f"event={name}", *(f"{k}={_value(v)}" for k, v in fields.items())]))
