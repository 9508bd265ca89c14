"""RESULTS.jsonl: one line per finished item, appended as answers arrive, read back to resume.

A line is {"index": I, "item": DIGEST, "result": {...}} for an answer (the
daemon's decide result, as it came) or {"index": I, "item": DIGEST,
"error": {"code": C, "message": M}} for a final error. DIGEST ties the line
to the suite line it answers, so a results file is never resumed or read
against a changed suite.

Each line goes to the file in one write() on an O_APPEND descriptor, as soon
as its answer is in: the kernel holds it once that returns, so Ctrl-C or a
kill loses at most the line being written. Such a torn last line (no
newline) is cut off when the file is opened to resume, and the item runs
again. A lock on the file keeps two runs from appending to it at once.
"""

import fcntl
import json
import os
from collections.abc import Mapping
from typing import Any

from ..answers import validate_answer
from ..errors import JevanyError
from .errors import EvalError
from .suite import Item

# What the eval itself reports in place of an answer that fails the client's self-check
# (keys, values in [0, 1], the sum, the argmax): such an answer is never scored.
INVALID_ANSWER = "invalid_answer"


def answer_record(item: Item, result: Any) -> dict:
    """The line for a daemon result; a result whose answers fail their self-check becomes an error line."""
    problem = answers_problem(item, result)
    if problem:
        return error_record(item, INVALID_ANSWER, problem)
    return {"index": item.index, "item": item.digest, "result": result}


def error_record(item: Item, code: str, message: str) -> dict:
    return {"index": item.index, "item": item.digest, "error": {"code": code, "message": message}}


def answers_problem(item: Item, result: Any) -> str | None:
    answers = result.get("answers") if isinstance(result, Mapping) else None
    if not isinstance(answers, Mapping):
        return "the result holds no answers map"
    for question in item.request.questions:
        try:
            validate_answer(question, answers.get(question.qid))
        except JevanyError as err:
            return err.message
    return None


class ResultsLog:
    """The results file opened to resume and append; `done` maps index -> record."""

    def __init__(self, path: str, items: list[Item]):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise EvalError(f"cannot open the results file {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise EvalError(f"{path}: another jevany-eval is writing this results file") from None
        try:
            self.done = self._resume(items)
        except BaseException:
            os.close(self.fd)
            raise

    def _resume(self, items: list[Item]) -> dict[int, dict]:
        data = _read_all(self.fd)
        records, kept = parse_records(data, items, self.path)
        if kept < len(data):
            os.truncate(self.fd, kept)          # a torn last line: that item runs again
        elif data and not data.endswith(b"\n"):
            os.write(self.fd, b"\n")            # a whole last line that lost only its newline
        return records

    def append(self, record: dict) -> None:
        os.write(self.fd, record_line(record))
        self.done[record["index"]] = record

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "ResultsLog":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def record_line(record: dict) -> bytes:
    return (json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n").encode()


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def read_results(path: str, items: list[Item]) -> dict[int, dict]:
    """A finished (or interrupted) results file, read only: index -> record."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise EvalError(f"cannot read the results file {path}: {exc.strerror or exc}") from None
    return parse_records(data, items, path)[0]


def parse_records(data: bytes, items: list[Item], path: str) -> tuple[dict[int, dict], int]:
    """(index -> record, how many leading bytes hold whole lines). An unterminated last line that
    does not parse is a write cut short by a kill, and is left out; anything else broken is an error."""
    by_index = {item.index: item for item in items}
    records: dict[int, dict] = {}
    where_seen: dict[int, int] = {}
    lines = data.split(b"\n")
    kept = 0
    for number, line in enumerate(lines, 1):
        last = number == len(lines)
        if not line.strip():
            kept += len(line) + (0 if last else 1)
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if last:
                break
            raise EvalError(f"{path}:{number}: not a JSON results line") from None
        index = _check_record(record, by_index, f"{path}:{number}")
        if index in records:
            raise EvalError(f"{path}:{number}: index {index} is already answered on line {where_seen[index]}")
        records[index], where_seen[index] = _checked(record, by_index[index]), number
        kept += len(line) + (0 if last else 1)
    return records, kept


def _check_record(record: Any, by_index: dict[int, Item], where: str) -> int:
    if not isinstance(record, dict) or ("result" in record) == ("error" in record):
        raise EvalError(f"{where}: a results line is {{index, item, result}} or {{index, item, error}}")
    index = record.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index not in by_index:
        raise EvalError(f"{where}: index {index!r} is not an item of the suite")
    if record.get("item") != by_index[index].digest:
        raise EvalError(f"{where}: index {index} was answered for a different suite line "
                        f"(the suite changed since); use a new results file")
    return index


def _checked(record: dict, item: Item) -> dict:
    """A hand-edited or older line whose answer fails the self-check counts as that error."""
    if "result" in record:
        problem = answers_problem(item, record["result"])
        if problem:
            return error_record(item, INVALID_ANSWER, problem)
        return record
    error = record["error"]
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return error_record(item, "invalid_results_line", f"the error is not {{code, message}}: {error!r:.200}")
    return record


def is_ok(record: dict) -> bool:
    return "result" in record
