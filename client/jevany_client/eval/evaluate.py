"""One `jevany-eval` run: read the suite, send what is not done yet, then report (and compare, plot).

Exit codes: 0 every item has its final outcome (answers and final errors
alike); 2 nothing could be run (a bad suite, results or option, no daemon);
3 items are left undone (the daemon stayed unavailable past --patience):
run the same command again; 130 interrupted (Ctrl-C), 143 stopped by SIGTERM,
with everything written so far kept.
"""

import asyncio
import os
import signal
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

from ..errors import JevTimeoutError, JevUnreachableError
from .compare import compare_runs
from .compare import summary as compare_summary
from .errors import EvalError
from .plot import check_plotting, plot_reliability
from .private import PrivateDaemon, log_path_for
from .report import build_report, rounded, write_report
from .report import summary as report_summary
from .results import ResultsLog, read_results
from .runner import Runner, RunSummary, rate_text
from .shards import Shard, parse_shard
from .suite import Item, read_suite

INCOMPLETE = 3
INTERRUPTED = 130
TERMINATED = 143


@dataclass
class Options:
    suite: str
    endpoints: list[str] | None = None      # None: the default endpoint
    concurrency: int = 32
    out: str | None = None                  # None: SUITE.results.jsonl beside the suite
    report: str | None = None
    plot: str | None = None
    compare: str | None = None
    timeout: float = 60.0                   # one request, the client's retries included
    patience: float = 120.0
    progress: bool = True
    routing: str | None = None              # None: least_loaded over several daemons
    shard: str | None = None                # "I/N" or "auto" (shards.py)
    serve: str | None = None                # serve arguments of a private daemon (private.py)
    serve_timeout: float = 600.0


def default_out(suite: str, shard: Shard | None = None) -> str:
    root, ext = os.path.splitext(suite)
    return f"{root if ext == '.jsonl' else suite}{'.' + shard.name if shard else ''}.results.jsonl"


def evaluate(options: Options, echo: Callable[[str], None] = print) -> int:
    items = read_suite(options.suite)
    shard = parse_shard(options.shard)
    if shard is not None:
        if options.compare:
            raise EvalError("--compare reads a whole run: merge the shards first, then compare")
        items = [item for item in items if shard.holds(item)]
    if options.serve is not None and options.endpoints:
        raise EvalError("--serve starts a daemon of its own: give --endpoint or --serve, not both")
    if options.plot:
        check_plotting()                                   # before the run, not after it
    other = read_results(options.compare, items) if options.compare else None
    out = options.out or default_out(options.suite, shard)
    with ResultsLog(out, items) as log:
        if not items:
            echo(f"{shard.name} holds none of the suite's items; {out} stays empty")
            return 0
        todo = [item for item in items if item.index not in log.done]
        if todo:
            code = _run(options, todo, log, len(items), echo)
            if code is not None:
                return code
        else:
            echo(f"nothing to send: all {len(items)} items already have their outcome in {out}")
        records = dict(log.done)
    report = build_report(items, records)
    if other is not None:
        report["compare"] = rounded(compare_runs(items, records, other))
    if options.report:
        write_report(report, options.report)
    echo(report_summary(report))
    if other is not None:
        echo(compare_summary(report["compare"]))
    if options.plot:
        plot_reliability(report, options.plot)
    return 0 if report["complete"] else INCOMPLETE


def _run(options: Options, todo: list[Item], log: ResultsLog, total: int, echo) -> int | None:
    """Send the items; an exit code if the run ended early, None if the report should follow."""
    private = PrivateDaemon(options.serve, log_path_for(log.path), options.serve_timeout) if options.serve else None
    try:
        with private or nullcontext():
            endpoints = [private.endpoint] if private else options.endpoints
            outcome = asyncio.run(_send(options, endpoints, todo, log, total))
    except KeyboardInterrupt:
        echo(f"interrupted: {len(log.done)} of {total} items are in {log.path}; "
             "run the same command again to finish")
        return INTERRUPTED
    except asyncio.CancelledError:
        echo(f"stopped by SIGTERM: {len(log.done)} of {total} items are in {log.path}")
        return TERMINATED
    echo(_sent(outcome) + _retried(outcome))
    if outcome.stopped:
        echo(f"stopped early: {outcome.stopped}; {outcome.left} items not done, "
             "run the same command again to finish them")
    return None


def _sent(outcome: RunSummary) -> str:
    """The run's rate, the quantity the bar shows (RunSummary.rate), or that it finished nothing."""
    if not outcome.finished:
        return "no item finished by this run, so no rate"
    return (f"{outcome.finished} items finished by this run in {outcome.sending_s():.2f} s of sending: "
            f"{rate_text(outcome.rate())} (from its first request to its last outcome)")


def _retried(outcome: RunSummary) -> str:
    if not outcome.retried:
        return ""
    return " (tried again after: " + ", ".join(f"{code} {n}" for code, n in sorted(outcome.retried.items())) + ")"


async def _send(options: Options, endpoints, todo: list[Item], log: ResultsLog, total: int) -> RunSummary:
    from ..async_client import AsyncJevClient    # pyzmq and rich load only when there is something to send
    from .progress import ProgressBar

    main = asyncio.current_task()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        client = AsyncJevClient(endpoints, timeout=options.timeout, routing=options.routing)
    except ValueError as exc:
        raise EvalError(f"--endpoint: {exc}") from None
    async with client:
        await _reach(client, options.timeout)
        with ProgressBar(total, total - len(todo), enabled=options.progress) as bar:
            runner = Runner(client, log, concurrency=options.concurrency, patience=options.patience,
                            on_change=bar.update)
            return await runner.run(todo)


async def _reach(client, timeout: float) -> None:
    where = ", ".join(client.endpoints)
    try:
        await client.ping(timeout=min(timeout, 10.0))
    except JevUnreachableError as err:
        raise EvalError(err.message) from None
    except JevTimeoutError:
        raise EvalError(f"daemon not reachable at {where} within {min(timeout, 10.0):g}s") from None
    except ValueError as exc:                     # an endpoint ZeroMQ cannot parse
        raise EvalError(f"--endpoint: {exc}") from None
