"""Build the starter model: train it on the starter suite and write a JevAny run directory.

The directory is an ordinary checkpoint (base model in OUT/base, tokenizer,
LoRA adapter, head.pt with a pointer head and its fitted temperature), plus
the held-out split as a suite (OUT/heldout.jsonl) and what the build measured
(OUT/training.json). Its figures come from loading the finished directory the
way the daemon does and scoring the held-out split through the engine, not
from the training loop.

A build says what it is doing through a Progress: silent by default; the
command's StageLines writes each stage, and each step with its loss, to
stderr (a line rewritten in place on a terminal, else a line every few
seconds), so stdout keeps only the figures.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TextIO

import torch

from jevany_daemon.model import tiny
from jevany_daemon.model.checkpoint import HEAD_FILE
from jevany_daemon.model.pointer_head import PointerHead

from . import evaluate, suite
from .train import Recipe, Trainer, fit_head, fit_temperature, fixed_threads, tune

ARCH, SHAPE = "qwen3", "starter"
HELDOUT_FILE, TRAINING_FILE = "heldout.jsonl", "training.json"
CALIBRATION_SEED = 2


class Progress:
    """Where a build is: stage(what, steps) as each stage starts, step(done, loss) after each step. Silent."""

    def stage(self, what: str, steps: int = 0) -> None:
        pass

    def step(self, done: int, loss: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass


class StageLines(Progress):
    """Progress for a person: "[  12 s] training the head: step 120 of 800, loss 0.8312".

    On a terminal the stage's line is rewritten in place (at most every
    REDRAW_S); elsewhere (a log, a pipe) each stage gets a line when it starts
    and its steps a line every every_s seconds and at its last step.
    """
    REDRAW_S = 0.1

    def __init__(self, stream: TextIO | None = None, every_s: float = 5.0, clock=time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s, self.clock = every_s, clock
        self.started = clock()
        self.what, self.steps, self.shown, self.open = "", 0, -1e9, False

    def stage(self, what: str, steps: int = 0) -> None:
        self.what, self.steps = what, steps
        self._show(what, force=True)

    def step(self, done: int, loss: float | None = None) -> None:
        text = f"{self.what}: step {done} of {self.steps}" + ("" if loss is None else f", loss {loss:.4f}")
        self._show(text, force=done == self.steps)

    def close(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False

    def _show(self, text: str, force: bool) -> None:
        now = self.clock()
        if not force and now - self.shown < (self.REDRAW_S if self.tty else self.every_s):
            return
        self.shown = now
        line = f"[{now - self.started:4.0f} s] {text}"
        if self.tty:
            self.stream.write(f"\r\x1b[K{line}")      # back to the line's start, clear it, draw
            self.open = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def build_trained_model(out: Path | str, recipe: Recipe = Recipe(), progress: Progress | None = None) -> dict:
    """Train, write the run directory to OUT (which must not exist or be empty), and return its figures.

    The directory appears whole or not at all: it is written beside OUT and renamed into place.
    progress hears of each stage and step (see Progress); None: nothing is said.
    """
    progress = progress or Progress()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        started = time.perf_counter()
        with tiny.quiet(), torch.random.fork_rng(devices=[]), fixed_threads(recipe.threads):
            figures = _train_and_write(staging, recipe, progress)
        figures["train_seconds"] = round(time.perf_counter() - started, 1)
        progress.stage(f"measuring the held-out suite ({recipe.heldout_items} items) through the engine")
        figures["heldout"] = measure(staging)
        (staging / TRAINING_FILE).write_text(json.dumps(figures, indent=1) + "\n")
        os.replace(staging, out)
    finally:
        progress.close()
        shutil.rmtree(staging, ignore_errors=True)
    return figures


def splits(recipe: Recipe) -> tuple[list[dict], list[dict], list[dict]]:
    """(training, calibration, held-out) items; no state occurs in two of them."""
    train, heldout = suite.split(recipe.train_items, recipe.heldout_items)
    seen = {suite.state_key(item) for item in train + heldout}
    return train, suite.generate(recipe.calibration_items, CALIBRATION_SEED, exclude=seen), heldout


def _train_and_write(out: Path, recipe: Recipe, progress: Progress) -> dict:
    from peft import get_peft_model

    progress.stage("building the tokenizer and model")
    train_items, calibration, heldout = splits(recipe)
    tokenizer = tiny.build_tokenizer()
    causal_lm = tiny.build_causal_lm(ARCH, tokenizer, recipe.seed, SHAPE)
    causal_lm.save_pretrained(out / "base")      # before the adapter wraps its layers
    tokenizer.save_pretrained(out / "base")
    torch.manual_seed(recipe.seed + 1)
    peft_model = get_peft_model(causal_lm.get_decoder(), tiny.lora_config(causal_lm.get_decoder(), recipe.lora_rank))
    head = PointerHead(causal_lm.config.hidden_size, recipe.head_dim, recipe.head_residual_dim)
    trainer = Trainer(causal_lm, tokenizer, head)
    progress.stage(f"encoding the {len(train_items)} training items")
    batches = trainer.batches(train_items, recipe.batch_items)
    progress.stage("computing the frozen backbone's states", len(batches))
    trainer.freeze_states(batches, progress.step)
    progress.stage("training the head (backbone frozen)", recipe.head_steps)
    head_losses = fit_head(trainer, batches, recipe, progress.step)
    adapter = [p for p in peft_model.parameters() if p.requires_grad]
    tuned = batches[: recipe.tune_items // recipe.batch_items]
    progress.stage("tuning the adapter and head together", len(tuned))
    tune_losses = tune(trainer, tuned, adapter + list(head.parameters()), recipe, progress.step)
    progress.stage(f"fitting the temperature on {len(calibration)} calibration items")
    temperature = fit_temperature(trainer, trainer.batches(calibration, recipe.batch_items))
    progress.stage("writing the checkpoint")
    tiny.save_adapter(peft_model, out)
    tiny.save_run_tokenizer(tokenizer.save_pretrained, tokenizer, out)
    torch.save(tiny.head_meta("pointer", tokenizer, head, lora=recipe.lora_rank, temperature=temperature,
                              starter_recipe=asdict(recipe)), out / HEAD_FILE)
    suite.write_jsonl(heldout, out / HELDOUT_FILE)
    return {"recipe": asdict(recipe), "temperature": temperature,
            "head_loss": [round(head_losses[0], 4), round(head_losses[-1], 4)],
            "tune_loss": [round(tune_losses[0], 4), round(tune_losses[-1], 4)] if tune_losses else []}


def measure(run_dir: Path | str, batch: int = 16) -> dict:
    """Held-out accuracy and ECE of a run directory, loaded as the daemon loads it and scored by its engine."""
    from jevany_daemon.inprocess import JevModel

    items = suite.read_jsonl(Path(run_dir) / HELDOUT_FILE)
    model = JevModel.load(str(run_dir), max_batch_size=batch)
    engine = model.engine
    results = engine.score([engine.admit(suite.body(item)) for item in items])
    return evaluate.report(items, [r if isinstance(r, dict) else None for r in results])
