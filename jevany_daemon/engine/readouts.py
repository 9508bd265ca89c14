"""How gathered hidden states become probabilities: pointer head, lm_token or choice-token.

Every readout receives only the hidden states at the positions it reads
(the layouts gather them), and projects onto the few vocabulary rows it
needs, never the whole vocabulary at every position.

On a GPU every host-device exchange in the middle of a pass waits for the
kernels queued before it. So a readout lays out its index lists from the
option counts before the pass (``plan``), in the pass's one upload, and
returns its probabilities on the device: the engine brings every question's
to the host in one copy.

A pass padded to a bucket of the shape plan (shape_plan.py) reads out in a
fixed shape too (``fixed``): its gathered states, a fixed number of them,
come with index lists of fixed lengths, and every op depends only on those
lengths, so the readout can be compiled or captured with the forward. Its
probabilities come back in a fixed layout, which ``unpack`` reads on the host.
"""
import torch

from jevany_daemon.model.decision_model import DecisionModel
from jevany_daemon.model.invariant import rows_matmul

from .pass_inputs import Upload
from .prompts import CHOICE_IDS


def make_readout(model: DecisionModel, choice_temperature: float | None = None, batch_invariant: bool = False):
    """The model's readout; choice_temperature (None: the model's) applies to the choice readout only.
    batch_invariant: label rows projected in fixed pieces (model/invariant.py)."""
    if model.readout == "choice":
        readout = ChoiceReadout(model, choice_temperature)
    else:
        readout = {"pointer": PointerReadout, "lm_token": TokenReadout}[model.readout](model)
    # The pointer head's linear layers are the model's, already swapped (model/invariant.py); the softmax
    # over a pass's padded options is invariant as torch runs it (its padding is exact zeros at the end).
    if batch_invariant and not isinstance(readout, PointerReadout):
        readout.matmul = rows_matmul
    return readout


class Plan:
    """Where each question's options sit: index lists in the pass's upload, tensors once it is sent."""

    def __init__(self, counts: list[int], width: int, upload: Upload, **lists: list[int]):
        self.counts, self.width, self.upload = counts, width, upload
        self._handles = {name: upload.add(values) for name, values in lists.items()}

    def __getattr__(self, name: str) -> torch.Tensor:
        # cells: flat grid position of every option, question by question; pointer only: decide
        # (rows of the gathered states holding DECIDE), options (each option's close token), owners
        # (the question of each option)
        handles = self.__dict__.get("_handles", {})
        if name not in handles:
            raise AttributeError(name)
        return self.upload[handles[name]]


def _cells(counts: list[int], width: int) -> list[int]:
    return [q * width + j for q, k in enumerate(counts) for j in range(k)]


def _softmax(logits: torch.Tensor, plan: Plan, temperature: float) -> torch.Tensor:
    """Softmax per question over [sum(counts)] logits, on the device: [sum(counts)] fp32 probabilities."""
    if temperature != 1.0:
        logits = logits / temperature
    grid = logits.new_full((len(plan.counts) * plan.width,), float("-inf"))
    grid.index_copy_(0, plan.cells, logits)
    return grid.view(len(plan.counts), plan.width).softmax(-1).view(-1).index_select(0, plan.cells)


def split(flat: list[float], counts: list[int]) -> list[list[float]]:
    """A pass's probabilities, as the host got them in one copy, question by question."""
    out, at = [], 0
    for k in counts:
        out.append(flat[at: at + k])
        at += k
    return out


def _label_rows(model: DecisionModel, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 copies of the output-projection rows (and bias) for the given token ids."""
    head = model.causal_lm.get_output_embeddings() or model.causal_lm.get_input_embeddings()
    index = torch.tensor(ids, device=head.weight.device)
    # On the device the decoder's states come out on (the head may sit with the embedding).
    out = model.output_device
    weight = head.weight.detach().index_select(0, index).float().to(out)
    bias = getattr(head, "bias", None)
    return weight, None if bias is None else bias.detach().index_select(0, index).float().to(out)


class PointerReadout:
    """Trained pointer head: the DECIDE state queries each option's close-token state."""

    def __init__(self, model: DecisionModel):
        self.head, self.temperature = model.head, model.temperature
        self.max_options = model.max_options

    def plan(self, counts: list[int], upload: Upload) -> Plan:
        # The gathered states come question by question: DECIDE, then its options.
        decide, options, owners, at = [], [], [], 0
        for q, k in enumerate(counts):
            decide.append(at)
            options.extend(range(at + 1, at + 1 + k))
            owners.extend([q] * k)
            at += 1 + k
        width = max(counts)
        return Plan(counts, width, upload, cells=_cells(counts, width), decide=decide, options=options, owners=owners)

    def probabilities(self, hidden: torch.Tensor, plan: Plan) -> torch.Tensor:
        logits = self.head(hidden.index_select(0, plan.decide), hidden.index_select(0, plan.options),
                           plan.owners)
        return _softmax(logits, plan, self.temperature)

    # --- in a fixed shape: every gathered row scored as an option of its question ---------------

    def fixed_sizes(self, gathered: int) -> list[int]:
        """owner (the gathered row of each row's DECIDE), slot (its question; decide rows and padding a
        spare slot), for `gathered` rows."""
        return [gathered, gathered]

    def fixed_lists(self, counts: list[int], gathered: int) -> list[list[int]] | None:
        spare = gathered // 2        # a question reads at least two rows: its DECIDE and an option
        if sum(counts) + len(counts) > gathered or len(counts) > spare:
            return None
        owner, slot, at = [], [], 0
        for q, k in enumerate(counts):
            owner += [at] * (1 + k)
            slot += [spare] + [q] * k
            at += 1 + k
        rest = gathered - at
        return [owner + list(range(at, gathered)), slot + [spare] * rest]

    def fixed_probabilities(self, gathered: torch.Tensor, owner: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        """[G] probabilities: each option's within its question (decide rows and padding: garbage, finite).

        A softmax per question through its slot (max, exp, sum by index), so nothing depends on how
        many options a question has.
        """
        logits = self.head(gathered, gathered, owner)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        slots = gathered.shape[0] // 2 + 1
        peak = logits.new_full((slots,), float("-inf")).scatter_reduce(0, slot, logits, "amax")
        e = (logits - peak.index_select(0, slot)).exp()
        return e / e.new_zeros(slots).index_add(0, slot, e).index_select(0, slot)

    @staticmethod
    def fixed_used(counts: list[int]) -> int:
        return sum(counts) + len(counts)

    @staticmethod
    def unpack(flat: list[float], counts: list[int]) -> list[list[float]]:
        out, at = [], 0
        for k in counts:
            out.append(flat[at + 1: at + 1 + k])
            at += 1 + k
        return out


class _LabelReadout:
    """Shared by lm_token and choice-token: read one state per question, project onto label rows."""

    labels: int    # label columns label_logits returns
    matmul = staticmethod(torch.matmul)     # hidden states x label rows

    def plan(self, counts: list[int], upload: Upload) -> Plan:
        # The grid is the label scores themselves: question q's option j is column j of row q.
        return Plan(counts, self.labels, upload, cells=_cells(counts, self.labels))

    def probabilities(self, hidden: torch.Tensor, plan: Plan) -> torch.Tensor:
        scores = self.label_logits(hidden.float())
        return _softmax(scores.reshape(-1).index_select(0, plan.cells), plan, self.temperature)

    # --- in a fixed shape: one gathered row per question, every label scored ---------------------

    def fixed_sizes(self, gathered: int) -> list[int]:
        """options: how many of the labels each gathered row's question offers."""
        return [gathered]

    def fixed_lists(self, counts: list[int], gathered: int) -> list[list[int]] | None:
        if len(counts) > gathered:
            return None
        return [counts + [self.labels] * (gathered - len(counts))]     # padding: all finite

    def fixed_probabilities(self, gathered: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
        """[G x labels] probabilities, question by question, over its first `options` labels."""
        scores = self.label_logits(gathered.float())
        if self.temperature != 1.0:
            scores = scores / self.temperature
        offered = self.columns[None, :] < options[:, None]
        return scores.masked_fill(~offered, float("-inf")).softmax(-1).view(-1)

    def fixed_used(self, counts: list[int]) -> int:
        return len(counts) * self.labels

    def unpack(self, flat: list[float], counts: list[int]) -> list[list[float]]:
        return [flat[q * self.labels: q * self.labels + k] for q, k in enumerate(counts)]


class TokenReadout(_LabelReadout):
    """lm_token: DECIDE state through the frozen LM-head rows of the checkpoint's verbalizers."""

    def __init__(self, model: DecisionModel):
        self.temperature = model.temperature
        self.weight, self.bias = _label_rows(model, model.verbalizer_ids)
        self.labels = len(model.verbalizer_ids)
        self.max_options = min(model.max_options, self.labels)
        self.columns = torch.arange(self.labels, device=self.weight.device)    # label numbers (fixed form)

    def label_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self.matmul(hidden, self.weight.T)
        return z if self.bias is None else z + self.bias


class ChoiceReadout(_LabelReadout):
    """Training-free: the last prompt state onto every token that decodes exactly to an option ID.

    An ID may have several aliases in the vocabulary; their probability mass is
    pooled with log-sum-exp, after the model's final-logit softcap if it has one.
    """

    def __init__(self, model: DecisionModel, temperature: float | None = None):
        self.temperature = model.temperature if temperature is None else float(temperature)
        aliases = choice_aliases(model.tokenizer)
        usable = 0
        while usable < len(CHOICE_IDS) and aliases[CHOICE_IDS[usable]]:
            usable += 1
        if usable < 2:
            raise ValueError("tokenizer has no single-token option IDs A and B; the choice readout cannot run")
        self.labels = usable
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
        index = index.to(self.weight.device)
        self.alias_rows, self.no_alias = index.clamp(min=0), index < 0
        self.columns = torch.arange(self.labels, device=self.weight.device)    # label numbers (fixed form)
        self.softcap = getattr(model._text_config, "final_logit_softcapping", None)

    def label_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self.matmul(hidden, self.weight.T)
        if self.bias is not None:
            z = z + self.bias
        if self.softcap:
            z = self.softcap * torch.tanh(z / self.softcap)
        grouped = z[:, self.alias_rows].masked_fill(self.no_alias, float("-inf"))
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
