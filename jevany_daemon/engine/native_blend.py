"""The choice readout's native blend (JevAny's native_weight, legacy pointer_weight).

A JevAny checkpoint served through the choice readout can pool each answer
with what the checkpoint's own readout (pointer head or lm_token) says about
the same request: per question, the softmax over its options of
(1 - w) log p_choice + w log p_native. Each probability is floored at 1e-12
first, so an option one readout all but rules out stays finite. The native
readout reads its own prompt (JevAny's delimiters), so a blended request is
encoded twice and its batch runs a second, native pass.
"""
import math

from jevany_daemon.model.decision_model import DecisionModel

from .layouts import Shape
from .prompts import make_encoder
from .readouts import make_readout

FLOOR = 1e-12


class NativeBlend:
    def __init__(self, model: DecisionModel, weight: float, batch_invariant: bool = False):
        native = model.native()
        self.kind, self.temperature = native.readout, native.temperature
        self.readout = make_readout(native, batch_invariant=batch_invariant)
        self.encoder = make_encoder(native)
        self.weight = float(weight)

    def pool(self, choice: list[list[float]], native: list[list[float]]) -> list[list[float]]:
        return [pool(c, n, self.weight) for c, n in zip(choice, native, strict=True)]


def native_blend(model: DecisionModel, weight: float, batch_invariant: bool = False) -> NativeBlend | None:
    """The blend choice_native_weight asks for; None at 0 (no second pass). Refuses what cannot blend."""
    if weight == 0:
        return None
    if model.readout != "choice":
        raise ValueError(f"choice_native_weight={weight} blends the choice readout with the checkpoint's native "
                         f"readout, but this model is served with the {model.readout} readout; load it with "
                         "readout choice, or set choice_native_weight to 0")
    if model.native_readout is None:
        raise ValueError(f"choice_native_weight={weight} needs a JevAny checkpoint with a native readout (a run "
                         f"directory whose head.pt gives pointer or lm_token); {model.source!r} is a plain causal "
                         "LM, so there is nothing to blend with; set choice_native_weight to 0")
    return NativeBlend(model, weight, batch_invariant)


def pool(choice: list[float], native: list[float], weight: float) -> list[float]:
    logits = [(1 - weight) * math.log(max(c, FLOOR)) + weight * math.log(max(n, FLOOR))
              for c, n in zip(choice, native, strict=True)]
    top = max(logits)
    weights = [math.exp(z - top) for z in logits]
    total = sum(weights)
    return [x / total for x in weights]


def both_passes(choice: Shape, native: Shape) -> Shape:
    """What a blended request adds to a batch's padded cost: a bound each of its two passes stays within.
    Its choice part still shares its stem's row with the other requests on that stem, adding its own
    questions to it (the native pass never reads the prefix cache)."""
    return Shape(choice.rows + native.rows, max(choice.width, native.width), choice.prefix + native.prefix,
                 choice.stem, choice.shared, choice.tails)
