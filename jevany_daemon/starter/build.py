"""Build the starter model: train it on the starter suite and write a JevAny run directory.

The directory is an ordinary checkpoint (base model in OUT/base, tokenizer,
LoRA adapter, head.pt with a pointer head and its fitted temperature), plus
the held-out split as a suite (OUT/heldout.jsonl) and what the build measured
(OUT/training.json). Its figures come from loading the finished directory the
way the daemon does and scoring the held-out split through the engine, not
from the training loop.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from jevany_daemon.model import tiny
from jevany_daemon.model.checkpoint import HEAD_FILE
from jevany_daemon.model.pointer_head import PointerHead

from . import evaluate, suite
from .train import Recipe, Trainer, fit_head, fit_temperature, fixed_threads, tune

ARCH, SHAPE = "qwen3", "starter"
HELDOUT_FILE, TRAINING_FILE = "heldout.jsonl", "training.json"
CALIBRATION_SEED = 2


def build_trained_model(out: Path | str, recipe: Recipe = Recipe()) -> dict:
    """Train, write the run directory to OUT (which must not exist or be empty), and return its figures.

    The directory appears whole or not at all: it is written beside OUT and renamed into place.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        started = time.perf_counter()
        with tiny.quiet(), torch.random.fork_rng(devices=[]), fixed_threads(recipe.threads):
            figures = _train_and_write(staging, recipe)
        figures["train_seconds"] = round(time.perf_counter() - started, 1)
        figures["heldout"] = measure(staging)
        (staging / TRAINING_FILE).write_text(json.dumps(figures, indent=1) + "\n")
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return figures


def splits(recipe: Recipe) -> tuple[list[dict], list[dict], list[dict]]:
    """(training, calibration, held-out) items; no state occurs in two of them."""
    train, heldout = suite.split(recipe.train_items, recipe.heldout_items)
    seen = {suite.state_key(item) for item in train + heldout}
    return train, suite.generate(recipe.calibration_items, CALIBRATION_SEED, exclude=seen), heldout


def _train_and_write(out: Path, recipe: Recipe) -> dict:
    from peft import get_peft_model

    train_items, calibration, heldout = splits(recipe)
    tokenizer = tiny.build_tokenizer()
    causal_lm = tiny.build_causal_lm(ARCH, tokenizer, recipe.seed, SHAPE)
    causal_lm.save_pretrained(out / "base")      # before the adapter wraps its layers
    tokenizer.save_pretrained(out / "base")
    torch.manual_seed(recipe.seed + 1)
    peft_model = get_peft_model(causal_lm.get_decoder(), tiny.lora_config(causal_lm.get_decoder(), recipe.lora_rank))
    head = PointerHead(causal_lm.config.hidden_size, recipe.head_dim, recipe.head_residual_dim)
    trainer = Trainer(causal_lm, tokenizer, head)
    batches = trainer.batches(train_items, recipe.batch_items)
    head_losses = fit_head(trainer, batches, recipe)
    adapter = [p for p in peft_model.parameters() if p.requires_grad]
    tune_losses = tune(trainer, batches[: recipe.tune_items // recipe.batch_items], adapter + list(head.parameters()),
                       recipe)
    temperature = fit_temperature(trainer, trainer.batches(calibration, recipe.batch_items))
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
