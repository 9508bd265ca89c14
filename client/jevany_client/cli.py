"""The jevany-client, jevany-ctl and jevany-eval command lines.

Exit codes: 0 success; 1 the daemon answered with an error; 2 no answer was
possible (daemon not reachable, bad endpoint, unreadable request file).

Their help has jevany-daemon's plain layout: at most 80 columns, each option's
default and, where one may set it, its environment variable.
"""

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import typer

from .endpoints import PROBE_S, check_endpoint, default_control_endpoint, default_endpoint, tcp_problem
from .errors import JevanyError, JevTimeoutError, JevUnreachableError
from .questions import media_from_path
from .status_page import format_models, format_status


def _plain_app(name: str, **options) -> typer.Typer:
    # Plain help, as jevany-daemon's: typer's boxed panels cut it at the terminal's width.
    return typer.Typer(name=name, add_completion=False, rich_markup_mode=None, **options)


client_app = _plain_app("jevany-client", no_args_is_help=True)
ctl_app = _plain_app("jevany-ctl", no_args_is_help=True)

_ENDPOINT_HELP = "Daemon endpoint. [default: ipc://$XDG_RUNTIME_DIR/jevany/daemon.sock] [env: JEVANY_ENDPOINT]"
_ENDPOINTS_HELP = ("Daemon endpoint; repeat to spread over several daemons. dns+tcp://NAME:PORT stands for every "
                   "address of NAME (looked up through $JEVANY_DNS_SERVER where set). "
                   "[default: ipc://$XDG_RUNTIME_DIR/jevany/daemon.sock] [env: JEVANY_ENDPOINT]")
_CONTROL_HELP = ("Daemon control endpoint. [default: ipc://$XDG_RUNTIME_DIR/jevany/control.sock] "
                 "[env: JEVANY_CONTROL_ENDPOINT]")
_TIMEOUT_HELP = "Seconds to wait for the reply."
_ROUTING_HELP = ("With several daemons: least_loaded, affinity (a state's head keeps it on one daemon's prefix "
                 "cache) or round_robin. [default: least_loaded]")
_JSON_HELP = "Print the raw result as JSON. [default: off]"
_NONE = " [default: none]"


def _fail(code: int, message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def _ask(endpoints: list[str], timeout: float, action: Callable[[Any], Any], routing: str | None = None) -> Any:
    from .client import JevClient  # pyzmq loads only when a command talks to a daemon

    where = ", ".join(endpoints)
    try:
        for endpoint in endpoints:
            check_endpoint(endpoint)
    except ValueError as err:
        raise _fail(2, f"error: {err}") from None
    _probe(endpoints, min(PROBE_S, timeout))
    try:
        with JevClient(endpoints, timeout=timeout, routing=routing) as client:
            return action(client)
    except JevUnreachableError as err:
        raise _fail(2, err.message) from None
    except JevTimeoutError as err:
        hint = " (connected, but no reply came: the daemon may be busy or hung)" if err.sent else ""
        raise _fail(2, f"daemon not reachable at {where} within {timeout:g}s{hint}") from None
    except JevanyError as err:
        raise _fail(1, f"error: {err.code}: {err.message}") from None
    except ValueError as err:  # an endpoint ZeroMQ cannot parse
        raise _fail(2, f"error: {err}") from None


def _probe(endpoints: list[str], within: float) -> None:
    """Fail in seconds where every endpoint is a tcp:// one at which no daemon can answer: the client's
    socket would wait the whole --timeout for it in silence (it waits so for a daemon that is starting)."""
    if not all(e.startswith("tcp://") for e in endpoints):
        return
    problems = [tcp_problem(e, within) for e in endpoints]
    if all(problems):
        raise _fail(2, "\n".join(f"error: {e}: {problem}" for e, problem in zip(endpoints, problems)))


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


# -- jevany-client -----------------------------------------------------------


@client_app.callback()
def client_main() -> None:
    """Send requests to a jevany daemon."""


@client_app.command("decide")
def decide(
    file: str = typer.Argument(
        ..., metavar="FILE.json", help="A decide body as JSON; - reads stdin."
    ),
    endpoint: list[str] = typer.Option(None, "--endpoint", "-e", metavar="ENDPOINT", help=_ENDPOINTS_HELP,
                                       show_default=False),
    timeout: float = typer.Option(30.0, "--timeout", min=0.001, help=_TIMEOUT_HELP),
    routing: str = typer.Option(None, "--routing", help=_ROUTING_HELP, show_default=False),
    media: list[str] = typer.Option(
        None, "--media", metavar="PATH", help="An image or video for the request (repeatable): a path in the "
        "daemon's media root, or relative to it; its suffix says which, or write image:PATH / video:PATH. Added "
        "after any media in FILE.json." + _NONE, show_default=False,
    ),
) -> None:
    """Ask one decision and print the result as JSON.

    FILE.json holds the decide body: {"state": ..., "questions": {id: {"type":
    "choice"|"noul"|"score", "criteria": ...}}, "model"?: ..., "media"?: [...]}.
    A daemon error prints "error: CODE: MESSAGE" and exits 1.
    """
    body = _read_body(file)
    if media:
        try:
            extra = [media_from_path(path).to_wire() for path in media]
        except ValueError as exc:
            raise _fail(2, f"error: --media: {exc}") from None
        body["media"] = list(body.get("media") or []) + extra
    result = _ask(endpoint or [default_endpoint()], timeout, lambda c: c.decide_many([body])[0], routing)
    _print_json(result)


def _read_body(file: str) -> dict:
    try:
        text = sys.stdin.read() if file == "-" else open(file, encoding="utf-8").read()
        body = json.loads(text)
    except (OSError, ValueError) as exc:
        raise _fail(2, f"error: cannot read a JSON decide body from {file}: {exc}") from None
    if not isinstance(body, dict):
        raise _fail(2, f"error: {file} must hold a JSON object, the decide body")
    return body


# -- jevany-client eval, also installed as jevany-eval ------------------------

eval_app = _plain_app("jevany-eval")


def eval_suite(
    suite: str = typer.Argument(
        ..., metavar="SUITE.jsonl",
        help="One decide body per line, plus labels: {question id: option key | true/false | level index}.",
    ),
    endpoint: list[str] = typer.Option(None, "--endpoint", "-e", metavar="ENDPOINT", help=_ENDPOINTS_HELP,
                                       show_default=False),
    concurrency: int = typer.Option(32, "--concurrency", "-n", min=1, help="Requests in flight at once."),
    out: str = typer.Option(
        None, "--out", "-o", metavar="RESULTS.jsonl",
        help="Results, one line per item, appended as they arrive; a rerun skips what is there. "
        "[default: SUITE.results.jsonl beside the suite]", show_default=False,
    ),
    report: str = typer.Option(None, "--report", metavar="REPORT.json", help="Write the report as JSON." + _NONE,
                               show_default=False),
    plot: str = typer.Option(
        None, "--plot", metavar="PNG", help="Draw the reliability diagram (needs matplotlib: the plot extra of "
        "jevany-client)." + _NONE, show_default=False,
    ),
    compare: str = typer.Option(
        None, "--compare", metavar="OTHER.jsonl",
        help="Another results file of the same suite: decisions changed, |dp|, paired metric differences."
        + _NONE, show_default=False,
    ),
    timeout: float = typer.Option(
        60.0, "--timeout", min=0.001, help="Seconds one request may take, the client's retries included."
    ),
    patience: float = typer.Option(
        120.0, "--patience", min=0.0,
        help="Stop (exit 3) when no item has finished for this many seconds while requests keep "
        "failing retryably (daemon busy, restarting or gone); a rerun finishes the rest.",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show the progress bar on stderr."),
    routing: str = typer.Option(None, "--routing", help=_ROUTING_HELP, show_default=False),
    shard: str = typer.Option(
        None, "--shard", metavar="I/N|auto",
        help="Run only shard I of N (items by a digest of their state); auto reads I and N from a Slurm "
        "array task or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, JEVANY_SHARD_COUNT). --out then "
        "defaults to SUITE.shard-I-of-N.results.jsonl. Join the shards with `jevany-eval merge`. "
        "[default: the whole suite]",
        show_default=False,
    ),
    serve: str = typer.Option(
        None, "--serve", metavar="'SERVE ARGS'",
        help="Start a daemon of this run's own with these `jevany-daemon serve` arguments, on a private ipc "
        "socket, and drain it at exit; its log goes beside the results. [default: none, use --endpoint's]",
        show_default=False,
    ),
    serve_timeout: float = typer.Option(600.0, "--serve-timeout", min=0.001,
                                        help="Seconds the --serve daemon may take to load."),
) -> None:
    """Evaluate a labelled suite through the daemon: resumable results, then a report.

    Prints accuracy, NLL, Brier score and ECE with 95% bootstrap intervals, per
    question type and overall. Exit 0 when every item is done, 2 when nothing
    could run (bad suite or option, no daemon), 3 when items are left undone
    (run the same command again), 130 on Ctrl-C.

    jevany-eval merge SUITE.jsonl RESULTS.jsonl... --out MERGED.jsonl joins the
    results files of one suite (the shards of --shard) into one, each line
    checked against the suite, and reports on them as one run: see `jevany-eval
    merge --help`.
    """
    from .eval import EvalError, Options, evaluate

    options = Options(suite=suite, endpoints=endpoint or None, concurrency=concurrency, out=out,
                      report=report, plot=plot, compare=compare, timeout=timeout, patience=patience,
                      progress=progress, routing=routing, shard=shard, serve=serve, serve_timeout=serve_timeout)
    if routing is not None:
        _check_routing(routing)
    try:
        code = evaluate(options, echo=typer.echo)
    except EvalError as err:
        raise _fail(2, f"error: {err}") from None
    raise typer.Exit(code)


def eval_merge(
    suite: str = typer.Argument(..., metavar="SUITE.jsonl", help="The suite the results answer."),
    results: list[str] = typer.Argument(..., metavar="RESULTS.jsonl...", help="Results files: the shards."),
    out: str = typer.Option(..., "--out", "-o", metavar="MERGED.jsonl", help="The merged results file."),
    report: str = typer.Option(None, "--report", metavar="REPORT.json", help="Write the report as JSON." + _NONE,
                               show_default=False),
) -> None:
    """Join results files of one suite: every line checked against the suite, conflicting duplicates
    refused (exit 2), missing items listed (exit 3); the report is a single run's."""
    from .eval import EvalError
    from .eval.merge import merge

    try:
        code = merge(suite, results, out, report, echo=typer.echo)
    except EvalError as err:
        raise _fail(2, f"error: {err}") from None
    raise typer.Exit(code)


def _check_routing(routing: str) -> None:
    from .routing import ROUTINGS

    if routing not in ROUTINGS:
        raise _fail(2, f"error: --routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")


eval_app.command()(eval_suite)
merge_app = _plain_app("jevany-eval merge")
merge_app.command()(eval_merge)


def _moved(name: str, door: str) -> None:
    # One door for each command: a name that used to work says where the command lives, in one line.
    def moved() -> None:
        raise _fail(2, f"error: `jevany-client {name}` is `{door}`: run `{door} --help`")

    client_app.command(name, hidden=True, context_settings={"ignore_unknown_options": True,
                                                           "allow_extra_args": True})(moved)


_moved("eval", "jevany-eval")
_moved("eval-merge", "jevany-eval merge")


def eval_main() -> None:
    """jevany-eval SUITE ... runs a suite; jevany-eval merge SUITE RESULTS... joins results files."""
    if sys.argv[1:2] == ["merge"]:
        merge_app(args=sys.argv[2:], prog_name="jevany-eval merge")
    else:
        eval_app()


# -- jevany-ctl --------------------------------------------------------------


@ctl_app.callback()
def ctl_main() -> None:
    """Inspect and control a running jevany daemon.

    status, ping and models go to the public endpoint; clear-cache, drain and
    reload go to the control endpoint. Without a reply within --timeout
    seconds a command exits 2.
    """


@ctl_app.command("status")
def status(
    endpoint: str = typer.Option(None, "--endpoint", "-e", help=_ENDPOINT_HELP, show_default=False),
    timeout: float = typer.Option(3.0, "--timeout", min=0.001, help=_TIMEOUT_HELP),
    as_json: bool = typer.Option(False, "--json", help=_JSON_HELP, show_default=False),
    ready: bool = typer.Option(
        False, "--ready", help="Print only the state; exit 0 if ready, 1 if not (starting, draining, drained, "
        "or no worker up while one is replaced), 2 if no reply: an exec probe for a ZeroMQ-only pod. "
        "[default: off]", show_default=False,
    ),
    watch: float = typer.Option(
        None, "--watch", "-w", min=0.1, metavar="SECONDS", help="Show the page again every SECONDS until Ctrl-C "
        "(on a terminal, in place). [default: once]", show_default=False,
    ),
) -> None:
    """Show the model, workers, queue, batching, latency and error counts."""
    where = endpoint or default_endpoint()
    if watch is not None and not (ready or as_json):
        _watch_status(where, timeout, watch)
    result = _ask([where], timeout, lambda c: c.status())
    if ready:
        state = result.get("state") if isinstance(result, dict) else None
        if state == "ready" and not result.get("serving", True):
            state = "ready, but no worker is up (one is being replaced)"     # as /health's 503 loading
        typer.echo(f"{where}: {state}")
        raise typer.Exit(0 if state == "ready" else 1)
    if as_json:
        _print_json(result)
    else:
        typer.echo(format_status(result))


def _watch_status(where: str, timeout: float, every_s: float) -> None:
    """The status page every every_s seconds: redrawn in place on a terminal, one page after another
    elsewhere; a daemon that stops answering ends it (exit 2, as a single status would). One client
    (and one probe of a tcp:// endpoint) for the whole watch, not one a page."""
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""

    def pages(client) -> None:
        while True:
            page = format_status(client.status())
            typer.echo(f"{clear}{page}\n\n(every {every_s:g} s; Ctrl-C ends)" if clear else f"{page}\n")
            time.sleep(every_s)

    try:
        _ask([where], timeout, pages)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@ctl_app.command("ping")
def ping(
    endpoint: str = typer.Option(None, "--endpoint", "-e", help=_ENDPOINT_HELP, show_default=False),
    timeout: float = typer.Option(3.0, "--timeout", min=0.001, help=_TIMEOUT_HELP),
) -> None:
    """Check that the daemon answers, and print its version."""
    where = endpoint or default_endpoint()
    result = _ask([where], timeout, lambda c: c.ping())
    typer.echo(f"pong from {where}: version {result.get('version', '?')}")


@ctl_app.command("models")
def models(
    endpoint: str = typer.Option(None, "--endpoint", "-e", help=_ENDPOINT_HELP, show_default=False),
    timeout: float = typer.Option(3.0, "--timeout", min=0.001, help=_TIMEOUT_HELP),
    as_json: bool = typer.Option(False, "--json", help=_JSON_HELP, show_default=False),
) -> None:
    """Describe the loaded model: id, alias, source, readout, layout, limits, prefix cache."""
    result = _ask([endpoint or default_endpoint()], timeout, lambda c: c.models())
    if as_json:
        _print_json(result)
    else:
        typer.echo(format_models(result))


def _control_command(op: str, doc: str, settles: bool = False) -> None:
    """settles: the daemon replies once the op has finished (drain, reload), which can take
    minutes, so --timeout only bounds reaching it and --wait bounds the rest."""

    def command(
        control: str = typer.Option(None, "--control", "-c", help=_CONTROL_HELP, show_default=False),
        timeout: float = typer.Option(3.0, "--timeout", min=0.001, help=_TIMEOUT_HELP),
        wait: float = typer.Option(
            600.0, "--wait", min=0.001, hidden=not settles,
            help="Seconds to wait, once the daemon is reached, for the op to finish.",
        ),
    ) -> None:
        if not settles:
            result = _ask([control or default_control_endpoint()], timeout, lambda c: c.call(op))
        else:
            where = [control or default_control_endpoint()]
            result = _ask(where, timeout, lambda c: _settle(c, op, wait))
        _print_json(result)

    command.__doc__ = doc
    ctl_app.command(op.replace("_", "-"))(command)


PROGRESS_EVERY_S = 5.0
_WAITING_FOR = {
    "reload": "reloading: waiting for the new workers to load",
    "drain": "draining: waiting for the requests in flight to be answered",
}


@contextlib.contextmanager
def _progress(what: str, every: float):
    """Say on stderr, every `every` seconds, what a long wait waits for, until it ends."""
    done = threading.Event()
    started = time.monotonic()

    def tell() -> None:
        while not done.wait(every):
            typer.echo(f"{what} ({time.monotonic() - started:.0f} s)", err=True)

    teller = threading.Thread(target=tell, name="jevany-ctl-progress", daemon=True)
    teller.start()
    try:
        yield
    finally:
        done.set()
        teller.join()


def _settle(client: Any, op: str, wait: float) -> Any:
    client.ping()
    try:
        with _progress(_WAITING_FOR.get(op, f"{op}: waiting for the daemon to finish"), PROGRESS_EVERY_S):
            return client.call(op, timeout=wait)
    except JevTimeoutError:
        raise _fail(2, f"the daemon took {op} but did not finish it within {wait:g}s") from None


_control_command("clear_cache", "Empty the daemon's prefix cache (control endpoint).")
_control_command(
    "drain",
    "Stop taking new work; reply once everything in flight is answered (control endpoint).",
    settles=True,
)
_control_command(
    "reload",
    "Start fresh workers (re-reading --config), switch to them once ready, retire the old ones; "
    "reply when the new ones serve (control endpoint).",
    settles=True,
)
