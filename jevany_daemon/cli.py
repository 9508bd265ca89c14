"""The jevany-daemon command line."""
import logging
from enum import Enum
from pathlib import Path

import typer

from jevany_daemon import serve_options

app = typer.Typer(
    name="jevany-daemon",
    help="Serve decision models to fleets of client processes over ZeroMQ.",
    no_args_is_help=True,
    add_completion=False,
    # Plain help: the boxed layout squeezed descriptions to a few words a line at 80 columns.
    rich_markup_mode=None,
)


class Arch(str, Enum):
    qwen3 = "qwen3"
    qwen3_5 = "qwen3_5"


class TinyReadout(str, Enum):
    choice = "choice"
    pointer = "pointer"
    lm_token = "lm_token"


@app.callback()
def main() -> None:
    """Serve decision models to fleets of client processes over ZeroMQ."""


STARTER_DIR = Path("runs/starter")


@app.command("tiny-model")
def tiny_model(
    ctx: typer.Context,
    out: Path = typer.Argument(None, metavar="OUT", help="Directory to write the model to (created if missing). "
                               f"Required, except with --trained: {STARTER_DIR}.", show_default=False),
    arch: Arch = typer.Option(
        Arch.qwen3, "--arch", help="qwen3: attention only. qwen3_5: hybrid Gated DeltaNet + attention."
    ),
    readout: TinyReadout = typer.Option(
        TinyReadout.choice,
        "--readout",
        help="choice: a plain Hugging Face model directory. pointer / lm_token: a JevAny run "
        "directory (LoRA adapter, head.pt) with its base model in OUT/base.",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for the random weights; same seed, same model."),
    multimodal: bool = typer.Option(
        False, "--multimodal", help="qwen3_5 only: the conditional-generation model with a tiny vision tower "
        "and its processor (images and videos). [default: off]", show_default=False,
    ),
    trained: bool = typer.Option(
        False, "--trained", help="Train the starter model instead (under a minute on 2 idle CPU cores, measured 16-41 s; "
        "minutes when other work shares the cores; each stage and step shown on stderr): a qwen3 "
        "pointer checkpoint that routes, rates and prioritises support tickets, with its held-out suite in "
        "OUT/heldout.jsonl and its held-out accuracy and ECE printed and kept in OUT/training.json. "
        "[default: off]", show_default=False,
    ),
) -> None:
    """A tiny random model; --trained: the starter model.

    Either has a real architecture and a tokenizer trained on the spot;
    nothing is downloaded. A random model is for tests and smoke
    deployments; the starter model is a small checkpoint that decides a real
    suite. Either loads through the same path as a real model or JevAny
    checkpoint.
    """
    if trained:
        _trained_model(ctx, out or STARTER_DIR, seed)
        return
    from jevany_daemon.model.tiny import build_tiny_model

    if out is None:
        typer.echo("error: missing argument OUT (only --trained has a default)", err=True)
        raise typer.Exit(2)
    if multimodal and arch != Arch.qwen3_5:
        typer.echo(f"error: --multimodal needs --arch qwen3_5, not {arch.value}", err=True)
        raise typer.Exit(2)
    try:
        path = build_tiny_model(out, arch=arch.value, readout=readout.value, seed=seed, multimodal=multimodal)
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    kind = " multimodal" if multimodal else ""
    typer.echo(f"wrote {arch.value}{kind} {readout.value} model to {path}")


def _trained_model(ctx: typer.Context, out: Path, seed: int) -> None:
    from jevany_daemon.starter.build import StageLines, build_trained_model
    from jevany_daemon.starter.evaluate import format_report
    from jevany_daemon.starter.train import Recipe

    # .name: the enum is click's, or typer's own copy of click's, depending on the typer version.
    fixed = [f"--{name.replace('_', '-')}" for name in ("arch", "readout", "multimodal")
             if ctx.get_parameter_source(name).name == "COMMANDLINE"]
    if fixed:
        typer.echo(f"error: --trained builds a qwen3 pointer checkpoint; {', '.join(fixed)} does not apply", err=True)
        raise typer.Exit(2)
    typer.echo(f"training the starter model into {out} ...")
    try:
        figures = build_trained_model(out, Recipe(seed=seed), StageLines())    # progress on stderr
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"trained in {figures['train_seconds']:.0f} s; held-out split ({out / 'heldout.jsonl'}), "
               "scored through the engine:")
    typer.echo(format_report(figures["heldout"]))
    typer.echo(f"wrote qwen3 pointer checkpoint to {out}")


@app.command("serve")
@serve_options.with_setting_options
def serve(**given) -> None:
    """Load the model and serve decide requests until SIGTERM or SIGINT, then drain and exit 0.

    SIGHUP (or jevany-ctl reload) reloads: fresh workers load the model named
    now (the --config file is read again), take over once ready, and the old
    ones finish what they hold.

    Every setting can also come from a JEVANY_<NAME> environment variable
    (e.g. JEVANY_MAX_BATCH_SIZE) or the --config file; a flag wins over the
    environment, which wins over the file. Two variables have no flag:
    JEVANY_LOG_LEVEL (DEBUG, INFO, WARNING or ERROR; default INFO) and
    JEVANY_CACHE_DIR (where the demo model is built; default ~/.cache/jevany).
    """
    from jevany_daemon.logs import configure_logging, event
    from jevany_daemon.server.settings import SettingsError, resolve
    from jevany_daemon.server.supervisor import StartupError, Supervisor

    try:
        flags = serve_options.flags(given)
        settings = resolve(flags, given["config"])
    except (serve_options.FlagError, SettingsError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    configure_logging()
    if settings.device_auto:
        event(logging.getLogger("jevany.supervisor"), "device_auto", device=settings.device, why=settings.device_auto)
    try:
        code = Supervisor(settings, reload_settings=lambda: resolve(flags, given["config"])).run()
    except StartupError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


@app.command("keygen")
def keygen(
    prefix: Path = typer.Argument(..., metavar="OUT_PREFIX", help="Writes OUT_PREFIX.key (public) and "
                                  "OUT_PREFIX.key_secret (secret, mode 0600)."),
) -> None:
    """Write a CurveZMQ key pair, for a daemon (--curve-secret-key) or a client.

    Give a daemon's .key file to its clients; put each client's .key file in
    the daemon's --curve-allowed-clients directory. Existing files are never
    overwritten.
    """
    from jevany_daemon.server.curve import write_keypair

    try:
        public, secret = write_keypair(prefix)
    except (FileExistsError, FileNotFoundError, PermissionError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {public} (public: give it to peers) and {secret} (secret: keep it here)")


def _with_variables(command) -> None:
    """Each setting's help names its JEVANY_ variable, so --help shows where a value may come from."""
    from jevany_daemon.server.settings import SETTINGS

    variables = {s.name: s.variable for s in SETTINGS if s.variable}
    for param in command.params:
        variable = variables.get(param.name)
        if variable and param.help and "[env:" not in param.help:
            param.help = f"{param.help} [env: {variable}]"


def main() -> None:
    """The console script (and python -m jevany_daemon): the typer app, with the variables in serve's help."""
    command = typer.main.get_command(app)
    _with_variables(command.commands["serve"])
    command(prog_name="jevany-daemon")
