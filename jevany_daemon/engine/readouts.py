"""How gathered hidden states become probabilities: pointer head, lm_token or choice-token.

Every readout receives only the hidden states at the positions it reads
(the layouts gather them), and projects onto the few vocabulary rows it
needs, never the whole vocabulary at every position.
"""
import torch

from jevany_daemon.model.decision_model import DecisionModel

from .prompts import CHOICE_IDS


def make_readout(model: DecisionModel):
    kinds = {"pointer": PointerReadout, "lm_token": TokenReadout, "choice": ChoiceReadout}
    return kinds[model.readout](model)


def _split_softmax(logits: torch.Tensor, counts: list[int], temperature: float) -> list[list[float]]:
    if temperature != 1.0:
        logits = logits / temperature
    return [chunk.softmax(-1).tolist() for chunk in logits.split(counts)]


def _label_rows(model: DecisionModel, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 copies of the output-projection rows (and bias) for the given token ids."""
    head = model.causal_lm.get_output_embeddings() or model.causal_lm.get_input_embeddings()
    index = torch.tensor(ids, device=head.weight.device)
    weight = head.weight.detach().index_select(0, index).float()
    bias = getattr(head, "bias", None)
    return weight, None if bias is None else bias.detach().index_select(0, index).float()


class PointerReadout:
    """Trained pointer head: the DECIDE state queries each option's close-token state."""

    def __init__(self, model: DecisionModel):
        self.head, self.temperature = model.head, model.temperature
        self.max_options = model.max_options

    def probabilities(self, hidden: torch.Tensor, counts: list[int]) -> list[list[float]]:
        offsets, decide_rows, option_rows = 0, [], []
        for k in counts:
            decide_rows.append(offsets)
            option_rows.extend(range(offsets + 1, offsets + 1 + k))
            offsets += 1 + k
        dev = hidden.device
        logits = self.head(
            hidden[torch.tensor(decide_rows, device=dev)],
            hidden[torch.tensor(option_rows, device=dev)],
            torch.tensor(counts, device=dev),
        )
        return _split_softmax(logits, counts, self.temperature)


class _LabelReadout:
    """Shared by lm_token and choice-token: read one state per question, project onto label rows."""

    def probabilities(self, hidden: torch.Tensor, counts: list[int]) -> list[list[float]]:
        scores = self.label_logits(hidden.float())
        picked = torch.cat([scores[i, :k] for i, k in enumerate(counts)])
        return _split_softmax(picked, counts, self.temperature)


class TokenReadout(_LabelReadout):
    """lm_token: DECIDE state through the frozen LM-head rows of the checkpoint's verbalizers."""

    def __init__(self, model: DecisionModel):
        self.temperature = model.temperature
        self.weight, self.bias = _label_rows(model, model.verbalizer_ids)
        self.max_options = min(model.max_options, len(model.verbalizer_ids))

    def label_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        z = hidden @ self.weight.T
        return z if self.bias is None else z + self.bias


class ChoiceReadout(_LabelReadout):
    """Training-free: the last prompt state onto every token that decodes exactly to an option ID.

    An ID may have several aliases in the vocabulary; their probability mass is
    pooled with log-sum-exp, after the model's final-logit softcap if it has one.
    """

    def __init__(self, model: DecisionModel):
        self.temperature = model.temperature
        aliases = choice_aliases(model.tokenizer)
        usable = 0
        while usable < len(CHOICE_IDS) and aliases[CHOICE_IDS[usable]]:
            usable += 1
        if usable < 2:
            raise ValueError("tokenizer has no single-token option IDs A and B; the choice readout cannot run")
        self.max_options = min(model.max_options, usable)
        groups = [aliases[c] for c in CHOICE_IDS[:usable]]
        flat = [t for g in groups for t in g]
        self.weight, self.bias = _label_rows(model, flat)
        width = max(len(g) for g in groups)
        # [IDs, width] index into the flat alias rows; -1 marks padding.
        index = torch.full((usable, width), -1, dtype=torch.long)
        at = 0
        for i, g in enumerate(groups):
            index[i, : len(g)] = torch.arange(at, at + len(g))
            at += len(g)
        self.index = index.to(self.weight.device)
        self.softcap = getattr(model._text_config, "final_logit_softcapping", None)

    def label_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        z = hidden @ self.weight.T
        if self.bias is not None:
            z = z + self.bias
        if self.softcap:
            z = self.softcap * torch.tanh(z / self.softcap)
        grouped = z[:, self.index.clamp(min=0)]
        grouped = grouped.masked_fill(self.index < 0, float("-inf"))
        return grouped.logsumexp(-1)


def choice_aliases(tokenizer) -> dict[str, list[int]]:
    """Every vocabulary id whose decoding is exactly one option ID, found by a full scan."""
    found = {c: [] for c in CHOICE_IDS}
    size = len(tokenizer)
    texts = tokenizer.batch_decode([[i] for i in range(size)])
    for token_id, text in enumerate(texts):
        if text in found:
            found[text].append(token_id)
    return found
