"""`jevany-eval merge`: the results files of a suite's shards (or of any runs) joined into one.

Every line is checked against the suite (its index and the digest of the
suite line it answers), as a resumed run checks it. The same item answered
in two files must have the same outcome there (the same answers and model,
or the same error code; latencies may differ): otherwise the files
disagree and nothing is written. The merged file lists every item once, in
index order, in the format a run writes, so `jevany-eval SUITE --out MERGED`
resumes it; its report is built as a single run's is, from the suite and the
records alone, so it is byte-identical to one run's with the same answers.
"""

import os
import tempfile
from collections.abc import Callable

from .errors import EvalError
from .evaluate import INCOMPLETE
from .report import build_report, write_report
from .report import summary as report_summary
from .results import is_ok, read_results, record_line
from .suite import read_suite

MISSING_SHOWN = 20


def merge(suite: str, inputs: list[str], out: str, report: str | None = None,
          echo: Callable[[str], None] = print) -> int:
    items = read_suite(suite)
    if not inputs:
        raise EvalError("merge needs at least one results file")
    merged: dict[int, dict] = {}
    where: dict[int, str] = {}
    for path in inputs:
        for index, record in read_results(path, items).items():
            if index in merged and _outcome(merged[index]) != _outcome(record):
                raise EvalError(f"index {index} has different outcomes in {where[index]} and {path}: "
                                f"{_describe(merged[index])} against {_describe(record)}; nothing was written")
            merged.setdefault(index, record)
            where.setdefault(index, path)
    _write_atomically(out, b"".join(record_line(merged[i]) for i in sorted(merged)))
    built = build_report(items, merged)
    if report:
        write_report(built, report)
    echo(f"merged {len(inputs)} results files into {out}: {len(merged)} of {len(items)} items")
    echo(report_summary(built))
    missing = [item.index for item in items if item.index not in merged]
    if missing:
        shown = ", ".join(map(str, missing[:MISSING_SHOWN])) + (", ..." if len(missing) > MISSING_SHOWN else "")
        echo(f"missing {len(missing)} items (index {shown}); run `jevany-eval {suite} --out {out}` to finish them")
        return INCOMPLETE
    return 0


def _outcome(record: dict):
    if is_ok(record):
        return ("result", record["result"].get("model"), record["result"].get("answers"))
    return ("error", record["error"].get("code"))


def _describe(record: dict) -> str:
    return "an answer" if is_ok(record) else f"the error {record['error'].get('code')}"


def _write_atomically(path: str, data: bytes) -> None:
    """Written beside its destination and renamed into place: never a half-written results file."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=".merge-", dir=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as exc:
        raise EvalError(f"cannot write the merged results {path}: {exc.strerror or exc}") from None
