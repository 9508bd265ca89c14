"""Train the starter model: a small qwen3 backbone with a LoRA adapter and a pointer head.

Training runs through the serving engine's own pieces: its encoder turns each
item into tokens, its layout builds the forward pass, its backbone call runs
the decoder and its readout's plan says which gathered states are DECIDE and
which are option closes. Only the last step differs: the pointer head's
logits go to a cross-entropy instead of to the host. So the served model
computes what was trained (the same tokens, masks and positions).

Two stages, because a backward pass through the backbone is what costs on a
CPU: first the head learns on states computed once (the backbone frozen, its
adapter still a no-op), then the adapter and head learn together for a few
passes. A temperature fitted on items held aside calibrates the result.
"""
from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.functional import cross_entropy

from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine
from jevany_daemon.model.checkpoint import DECISION_TOKENS
from jevany_daemon.model.decision_model import DecisionModel
from jevany_daemon.model.pointer_head import PointerHead

from . import suite


OnStep = Callable[[int, float | None], None] | None     # (steps done, loss or None): progress, for display


@dataclass(frozen=True)
class Recipe:
    """What a training run depends on; the same recipe (and thread count), the same weights."""
    seed: int = 0
    train_items: int = 1600
    calibration_items: int = 100
    heldout_items: int = 200
    batch_items: int = 50         # items per forward pass, both stages
    head_steps: int = 800         # stage 1: head only, on frozen states
    head_lr: float = 3e-3
    weight_decay: float = 0.1
    tune_items: int = 400         # stage 2: adapter and head together
    tune_lr: float = 2e-4
    lora_rank: int = 8
    head_dim: int = 64
    head_residual_dim: int = 16
    threads: int = 2


def option_index(question: dict, label) -> int:
    """Where a label sits among its question's options, in the order every readout sees them."""
    if question["type"] == "choice":
        return list(question["criteria"]).index(label)
    if question["type"] == "noul":
        return int(bool(label))      # native options: no, then yes
    return int(label)


def targets(items: list[dict]) -> torch.Tensor:
    return torch.tensor([option_index(q, item["labels"][qid]) for item in items
                         for qid, q in item["questions"].items()])


@contextlib.contextmanager
def fixed_threads(threads: int):
    """Torch's thread count pinned for a run: float sums, and so the weights, depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Batch:
    """One forward pass's worth of items: what the head reads, and the answers it should give."""
    admitted: list
    labels: torch.Tensor
    hidden: torch.Tensor | None = None    # gathered states, when computed with the backbone frozen
    plan: object = None


class Trainer:
    """The engine's encoding and forward pass, with gradients, over a model whose adapter and head learn."""

    def __init__(self, causal_lm, tokenizer, head: PointerHead):
        model = DecisionModel(model_id="starter", source="(training)", causal_lm=causal_lm, tokenizer=tokenizer,
                              readout="pointer", device=torch.device("cpu"), dtype=torch.float32,
                              decision_tokens=DECISION_TOKENS, head=head)
        self.engine = Engine(model, EngineConfig(max_packed_tokens=1 << 20, prefix_cache=0))
        self.head = head

    def batches(self, items: list[dict], size: int) -> list[Batch]:
        return [Batch([self.engine.admit(suite.body(i)) for i in items[at: at + size]], targets(items[at: at + size]))
                for at in range(0, len(items), size)]

    def gathered(self, batch: Batch):
        """(the states the readout reads, the readout's plan): the engine's layout, backbone and plan."""
        return self.engine.gathered(batch.admitted)

    def freeze_states(self, batches: list[Batch], on_step: OnStep = None) -> None:
        with torch.no_grad():
            for done, batch in enumerate(batches, 1):
                batch.hidden, batch.plan = self.gathered(batch)
                if on_step:
                    on_step(done, None)

    def logits(self, batch: Batch) -> torch.Tensor:
        """[questions, widest] logits, -inf past a question's last option (the softmax grid the readout uses)."""
        hidden, plan = (batch.hidden, batch.plan) if batch.hidden is not None else self.gathered(batch)
        scores = self.head(hidden.index_select(0, plan.decide), hidden.index_select(0, plan.options), plan.owners)
        grid = scores.new_full((len(plan.counts) * plan.width,), float("-inf")).index_copy(0, plan.cells, scores)
        return grid.view(len(plan.counts), plan.width)


def _optimise(params, steps: int, lr: float, weight_decay: float, loss_at, on_step: OnStep = None) -> list[float]:
    """AdamW on a cosine schedule; loss_at(step) gives each step's loss. Returns the losses.

    on_step(steps done, that step's loss), if given, after each step: the progress a person watches.
    """
    if steps == 0:
        return []
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    losses = []
    for step in range(steps):
        loss = loss_at(step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if on_step:
            on_step(step + 1, losses[-1])
    return losses


def fit_head(trainer: Trainer, batches: list[Batch], recipe: Recipe, on_step: OnStep = None) -> list[float]:
    """Stage 1: the head alone, on states computed once (frozen_states, or here)."""
    if any(batch.hidden is None for batch in batches):
        trainer.freeze_states(batches)
    rng = random.Random(recipe.seed)
    order = [rng.randrange(len(batches)) for _ in range(recipe.head_steps)]
    return _optimise(trainer.head.parameters(), recipe.head_steps, recipe.head_lr, recipe.weight_decay,
                     lambda step: cross_entropy(trainer.logits(batches[order[step]]), batches[order[step]].labels),
                     on_step)


def tune(trainer: Trainer, batches: list[Batch], params: list, recipe: Recipe, on_step: OnStep = None) -> list[float]:
    """Stage 2: adapter and head together, one pass over each batch, gradients through the backbone."""
    for batch in batches:
        batch.hidden = batch.plan = None
    return _optimise(params, len(batches), recipe.tune_lr, recipe.weight_decay,
                     lambda step: cross_entropy(trainer.logits(batches[step]), batches[step].labels), on_step)


def fit_temperature(trainer: Trainer, batches: list[Batch]) -> float:
    """The temperature that minimises the NLL of items held aside from training (golden-section search)."""
    with torch.no_grad():
        logits = torch.cat([trainer.logits(b) for b in batches])
    labels = torch.cat([b.labels for b in batches])

    def nll(log_t: float) -> float:
        return cross_entropy(logits / math.exp(log_t), labels).item()

    low, high = math.log(0.05), math.log(20.0)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if nll(a) < nll(b):
            high = b
        else:
            low = a
    return math.exp((low + high) / 2)
