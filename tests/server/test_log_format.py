"""The daemon's logs: one record per line, `event=NAME key=value ...`, at the level JEVANY_LOG_LEVEL names.

A value with a space, a quote, an `=` or a line break is written as a Python string literal, so a
record never spans two lines and its fields parse back to exactly what was logged. The parser here is
the test's own: bare values are runs of anything but whitespace, quotes and `=`; quoted ones are read
back with ast.literal_eval.
"""
import ast
import logging
import os
import re
import subprocess
import sys

import pytest

from jevany_daemon import workloads
from jevany_daemon.logs import event

from .shared_daemons import Raw, frozen, serving_worker

GOOD = workloads.short(1, seed=4)[0]

# What configure_logging puts before the message: asctime, level, logger, pid.
RECORD = re.compile(r"(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                    r"(?P<logger>[\w.]+) pid=(?P<pid>\d+) (?P<message>.*)")
FIELD = re.compile(r"""(?P<key>[A-Za-z_]\w*)=(?P<value>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|[^\s'"=]+)""")

# Values that would break a line, or a naive split on spaces or on '=', if written as they are.
AWKWARD = ["two words", "it's", 'say "hi"', "both ' and \"", "line one\nline two", "one\ntwo", "a=b", "=", "",
           "tab\there", "cr\r\nlf", "back\\slash and space", "trailing ", "x\u2028y", "fs\x1cgs", "ünï côdé wörds",
           "'", "\\n"]


def parse_message(message: str) -> dict:
    """`event=NAME k=v ...` -> {"event": NAME, k: v, ...}; fails on anything else."""
    fields, pos = {}, 0
    while True:
        found = FIELD.match(message, pos)
        assert found, f"no key=value at {pos} in {message!r}"
        raw = found["value"]
        value = ast.literal_eval(raw) if raw[0] in "'\"" else raw
        assert isinstance(value, str) and found["key"] not in fields, message
        fields[found["key"]] = value
        pos = found.end()
        if pos == len(message):
            break
        assert message[pos] == " ", f"fields not separated by one space at {pos} in {message!r}"
        pos += 1
    assert next(iter(fields)) == "event", message
    return fields


def parse_log(text: str) -> list[dict]:
    """Every line of a log as a record: its level, logger and pid with the message's fields."""
    assert text.endswith("\n"), text[-200:]
    records = []
    for line in text[:-1].split("\n"):
        record = RECORD.fullmatch(line)
        assert record, f"not a log record: {line!r}\n--- whole log:\n{text}"
        records.append({"level": record["level"], "logger": record["logger"], "pid": record["pid"],
                        **parse_message(record["message"])})
    return records


def logged(caplog, name: str, **fields) -> str:
    log = logging.getLogger("tests.log_format")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        caplog.clear()
        event(log, name, **fields)
    [record] = caplog.records
    return record.getMessage()


@pytest.mark.parametrize("value", AWKWARD + [3, 2.5, None, True], ids=repr)
def test_an_awkward_value_stays_on_its_line_and_parses_back(caplog, value):
    message = logged(caplog, "thing", value=value, after="plain")
    assert len(message.splitlines()) == 1 and "\n" not in message and "\r" not in message
    assert parse_message(message) == {"event": "thing", "value": str(value), "after": "plain"}


def test_every_awkward_value_in_one_record_parses_back(caplog):
    fields = {f"k{i}": value for i, value in enumerate(AWKWARD)}
    message = logged(caplog, "many", **fields)
    assert len(message.splitlines()) == 1
    assert parse_message(message) == {"event": "many", **fields}


@pytest.mark.parametrize("value", ["\x1b[31mred\x1b[0m", "bell\x07", "right\u202eto-left", "del\x7f", "\x00nul",
                                   "\u2066isolate\u2069", "zero\u200bwidth"], ids=repr)
def test_a_client_chosen_value_never_reaches_the_log_raw(caplog, value):
    # A request id with an escape sequence recoloured the operator's terminal; a right-to-left
    # override reordered the line. Every character that is not printable is written escaped.
    message = logged(caplog, "request", id=value)
    assert message.isprintable() and parse_message(message) == {"event": "request", "id": value}


@pytest.mark.parametrize("level, shown", [("INFO", ["info", "warning", "error"]),
                                          ("warning", ["warning", "error"]),     # any case
                                          ("ERROR", ["error"])])
def test_configure_logging_writes_records_at_the_level_jevany_log_level_names(level, shown):
    script = ("import logging\n"
              "from jevany_daemon.logs import configure_logging, event\n"
              "configure_logging()\n"
              "log = logging.getLogger('jevany.test')\n"
              "event(log, 'debug', level=logging.DEBUG, what='not at these levels')\n"
              "event(log, 'info', what='an info line')\n"
              "event(log, 'warning', level=logging.WARNING, what='a \"warning\"\\nof two lines')\n"
              "event(log, 'error', level=logging.ERROR, what='an = error')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "JEVANY_LOG_LEVEL": level})
    assert proc.returncode == 0, proc.stderr
    records = parse_log(proc.stderr)
    assert [r["event"] for r in records] == shown
    assert all(r["level"] == r["event"].upper() and r["logger"] == "jevany.test" for r in records)
    assert {r["pid"] for r in records} == {str(records[0]["pid"])} and records[0]["pid"] != str(os.getpid())
    expected = {"info": "an info line", "warning": 'a "warning"\nof two lines', "error": "an = error"}
    assert all(r["what"] == expected[r["event"]] for r in records)


def test_a_real_daemons_log_is_one_parseable_record_per_line(start_daemon, tiny_model, tmp_path):
    # The model's path and the request ids (logged by --log-requests) carry the awkward characters.
    odd = tmp_path / "it's a \"model\" dir=odd"
    odd.mkdir()
    (odd / "tiny model").symlink_to(tiny_model("qwen3", "pointer"))
    ids = list(AWKWARD)
    daemon = start_daemon("--log-requests", model=odd / "tiny model")
    with Raw(daemon.endpoint) as raw:
        for rid in ids:
            raw.send(rid, "decide", GOOD)
        replies = [raw.recv() for _ in ids]
    assert sorted(r["id"] for r in replies) == sorted(ids) and all(r["ok"] for r in replies)
    assert daemon.stop() == 0
    records = parse_log(daemon.log.read_text())
    requests = [r for r in records if r["event"] == "request"]
    assert sorted(r["id"] for r in requests) == sorted(ids)
    assert all(r["outcome"] == "ok" and float(r["ms"]) >= 0 and r["level"] == "INFO" for r in requests)
    [start] = [r for r in records if r["event"] == "start"]
    assert start["model"] == str(odd / "tiny model")
    [off] = [r for r in records if r["event"] == "batching_off"]     # JevAny's default, said with its flag
    assert start["max_batch_size"] == "1" and "--max-batch-size 32" in off["note"]
    events = [r["event"] for r in records]
    assert {"start", "warm_up", "worker_ready", "ready", "drain", "stop"} <= set(events)
    assert events[-1] == "stop" and records[-1]["exit_code"] == "0"
    # both the supervisor and its worker wrote records, each its own lines
    assert {r["logger"] for r in records} >= {"jevany.supervisor", "jevany.worker"}
    assert len({r["pid"] for r in records}) >= 2


def test_at_warning_a_daemon_logs_its_warnings_and_no_info_events(start_daemon):
    # The worker is stopped while a burst arrives, so a queue of one surely overflows: the overload is
    # logged at WARNING, each request's line (--log-requests, INFO) is not.
    daemon = start_daemon("--log-requests", "--max-queue", "1", "--max-batch-size", "1", "--heartbeat-timeout", "300",
                          env={"JEVANY_LOG_LEVEL": "WARNING"})
    n = 12
    with Raw(daemon.endpoint) as raw:
        with frozen(serving_worker(daemon)["pid"]):
            for i in range(n):
                raw.send(i, "decide", GOOD)
            first = raw.recv()                    # nothing is scored while the worker is stopped
        replies = [first] + [raw.recv() for _ in range(n - 1)]
    assert first["error"]["code"] == "overloaded"
    assert sorted(r["id"] for r in replies) == list(range(n))
    assert any(r["ok"] for r in replies)
    assert daemon.stop() == 0
    records = parse_log(daemon.log.read_text())
    overloads = [r for r in records if r["event"] == "overload"]
    assert overloads and overloads[0]["count"] == "1" and overloads[0]["level"] == "WARNING"
    assert [r for r in records if r["level"] not in ("WARNING", "ERROR")] == []
    assert not {"start", "ready", "worker_ready", "warm_up", "request", "drain", "stop"} & {r["event"] for r in records}
