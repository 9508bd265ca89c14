"""The jevany-daemon command line."""
from enum import Enum
from pathlib import Path

import typer

app = typer.Typer(
    name="jevany-daemon",
    help="Serve decision models to fleets of client processes over ZeroMQ.",
    no_args_is_help=True,
    add_completion=False,
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


@app.command("tiny-model")
def tiny_model(
    out: Path = typer.Argument(..., metavar="OUT", help="Directory to write the model to (created if missing)."),
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
) -> None:
    """Build a tiny random model of a real architecture, with a tokenizer trained on the spot.

    For tests and smoke deployments: nothing is downloaded, and the result
    loads through the same path as a real model or JevAny checkpoint.
    """
    from jevany_daemon.model.tiny import build_tiny_model

    try:
        path = build_tiny_model(out, arch=arch.value, readout=readout.value, seed=seed)
    except FileExistsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"wrote {arch.value} {readout.value} model to {path}")
