"""Decoder caches as blocks of rows, every layer of a kind in one tensor: a few ops per pass at any depth.

A decoder cache holds, per layer, attention keys and values [B, heads, L, d]
or a linear-attention layer's conv and recurrent states [B, ...]. Copying or
padding those per layer and per row costs a kernel launch each on a GPU:
thousands per pass at a real model's depth. So rows live in a ``Block``: the
keys and values of every attention layer stacked into one tensor, the conv
states into another, the recurrent states into a third. Stacking a pass's
cache is one op per kind; keeping one of its rows (a prefix cache entry) is
one clone per kind; joining rows for the next pass is one concatenation and
one indexed gather per kind, or a view when every row continues the same
entry (the prompt's pinned head).

Within a block, row r holds ``width`` positions, its real ones last (left
padding). Joined rows are left-padded to the widest; a zero slot fills the
padding, which the pass's mask never lets a query read. A row that
continues nothing starts from no keys and zero conv and recurrent states,
exactly where a recurrence starts without a cache.

Conv states are gathered into fresh memory, never viewed: linear-attention
layers update them in place during the pass. Recurrent states they only
read, once their update is an assignment (_RecurrentStateTaken): rows that
all continue one entry view it.
"""
import copy
from dataclasses import dataclass

import torch

_STATE_DICTS = ("conv_states", "recurrent_states")
_KINDS = ("conv", "recurrent")


@dataclass(eq=False)
class Block:
    """Rows of decoder cache. kv [2 x attention layers, heads, rows x width, d] (keys, values, layer by
    layer; row r at [r*width, (r+1)*width)); conv [linear layers, rows, ...]; recurrent likewise."""
    rows: int
    width: int
    kv: torch.Tensor | None = None
    conv: torch.Tensor | None = None
    recurrent: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.kv, self.conv, self.recurrent) if t is not None)

    def row(self, r: int, width: int) -> "Block":
        """Row r's last ``width`` positions as a block of its own, in its own memory (a cache entry)."""
        start = r * self.width + self.width - width
        return Block(1, width, None if self.kv is None else self.kv[:, :, start:start + width].clone(),
                     *(None if t is None else t[:, r:r + 1].clone() for t in (self.conv, self.recurrent)))


def _is_linear(layer) -> bool:
    return isinstance(getattr(layer, "conv_states", None), dict)


class CacheKit:
    """A model's decoder-cache structure, learnt from one real cache: stacks, keeps and joins rows."""

    def __init__(self, cache):
        layers = cache.layers
        self.linear = [i for i, layer in enumerate(layers) if _is_linear(layer)]
        self.attention = [i for i, layer in enumerate(layers) if i not in self.linear and hasattr(layer, "keys")]
        self._at = {i: k for k, i in enumerate(self.attention)} | {i: k for k, i in enumerate(self.linear)}
        if any(getattr(layers[i], "number_of_states", 1) != 1 for i in self.linear):
            raise ValueError("linear-attention layers with several states cannot be cached")
        # The zero slot that fills padding in a join (and starts a row that continues nothing).
        probe = self.block(cache)
        kv, conv, rec = probe.kv, probe.conv, probe.recurrent
        self._zero = Block(1, 1, None if kv is None else kv.new_zeros((kv.shape[0], kv.shape[1], 1, kv.shape[3])),
                           None if conv is None else conv.new_zeros((conv.shape[0], 1, *conv.shape[2:])),
                           None if rec is None else rec.new_zeros((rec.shape[0], 1, *rec.shape[2:])))
        self.template = copy.copy(cache)
        self.template.layers = []
        for layer in layers:          # the template holds no tensors of its own
            layer = copy.copy(layer)
            for name in ("keys", "values"):
                if hasattr(layer, name):
                    setattr(layer, name, None)
            for name in _STATE_DICTS:
                if isinstance(getattr(layer, name, None), dict):
                    setattr(layer, name, {0: None})
            self.template.layers.append(layer)

    # --- out of a pass ----------------------------------------------------------

    def block(self, cache) -> Block:
        """A pass's whole cache as one block: one stack per kind."""
        layers = cache.layers
        kv = conv = rec = None
        if self.attention:
            first = layers[self.attention[0]].keys            # [rows, heads, width, d]
            rows, width = first.shape[0], first.shape[2]
            kv = torch.stack([t.transpose(0, 1) for i in self.attention for t in (layers[i].keys, layers[i].values)])
            kv = kv.view(kv.shape[0], kv.shape[1], rows * width, kv.shape[4])
        if self.linear:
            conv = torch.stack([layers[i].conv_states[0] for i in self.linear])
            states = [layers[i].recurrent_states[0] for i in self.linear]
            rec = None if states[0] is None else torch.stack(states)
            rows = conv.shape[1]
        if not self.attention:
            width = 0
        return Block(rows, width, kv, conv, rec)

    def take(self, cache, row: int, start: int, end: int) -> Block:
        """Row ``row``'s positions [start, end) of a pass's cache as a block of one: one stack per kind.

        Its recurrent states are those at the end of the pass, so on a model
        that has them only a row that ends where the pass ends may be taken.
        """
        layers = cache.layers
        kv = None
        if self.attention:
            kv = torch.stack([t[row, :, start:end] for i in self.attention for t in (layers[i].keys, layers[i].values)])
        conv = rec = None
        if self.linear:
            conv = torch.stack([layers[i].conv_states[0][row:row + 1] for i in self.linear])
            states = [layers[i].recurrent_states[0] for i in self.linear]
            rec = None if states[0] is None else torch.stack([s[row:row + 1] for s in states])
        return Block(1, end - start, kv, conv, rec)

    # --- into a pass ------------------------------------------------------------

    def join(self, plan: "JoinPlan", kv_index: torch.Tensor | None, row_index: torch.Tensor | None):
        """A decoder cache of plan's rows, left-padded to the widest, from the index tensors of plan's lists."""
        kv = self._joined_kv(plan, kv_index)
        states = self._joined_states(plan, row_index)
        cache = copy.copy(self.template)
        cache.layers = []
        for i, template in enumerate(self.template.layers):
            layer = copy.copy(template)
            _own_dicts(layer)
            if i in self.attention:
                a = self._at[i]
                layer.keys, layer.values = kv[2 * a].transpose(0, 1), kv[2 * a + 1].transpose(0, 1)
            elif i in self.linear:
                j = self._at[i]
                layer.conv_states = {0: states[0][j]}
                layer.recurrent_states = {0: None if states[1] is None else states[1][j]}
                layer.update_recurrent_state = _RecurrentStateTaken(layer)
            cache.layers.append(layer)
        return cache

    def _joined_kv(self, plan: "JoinPlan", index: torch.Tensor | None) -> torch.Tensor | None:
        """[2La, heads, N, width, d]: a view of the one shared entry, else one gather."""
        if not self.attention:
            return None
        n = len(plan.refs)
        if plan.shared is not None:
            kv = plan.shared.kv[:, :, None]
            return kv.expand(kv.shape[0], kv.shape[1], n, kv.shape[3], kv.shape[4])
        flat = torch.cat([self._zero.kv] + [b.kv for b in plan.sources], dim=2).index_select(2, index)
        return flat.view(flat.shape[0], flat.shape[1], n, plan.width, flat.shape[3])

    def _joined_states(self, plan: "JoinPlan", index: torch.Tensor | None) -> list:
        """[Ll, N, ...] conv states in fresh memory; recurrent states likewise, or the one shared entry's
        viewed N times (see _RecurrentStateTaken)."""
        if not self.linear:
            return [None, None]
        out = []
        n = len(plan.refs)
        for kind in _KINDS:
            zero = getattr(self._zero, kind)
            if zero is None:
                out.append(None)
            elif plan.shared is not None:
                t = getattr(plan.shared, kind)
                rows = t.expand(t.shape[0], n, *t.shape[2:])
                # A layer updates its conv states in place, so they get fresh memory (they are small).
                # Recurrent states are only read: viewed, unless one row's view would be the entry
                # itself, contiguous, which a kernel could take as its own to write.
                out.append(rows if kind == "recurrent" and n > 1 else rows.clone(memory_format=torch.contiguous_format))
            else:
                out.append(torch.cat([zero] + [getattr(b, kind) for b in plan.sources], dim=1).index_select(1, index))
        return out


class JoinPlan:
    """How rows join: refs[r] = (block, row within it, real width) or None; the index lists of the gathers.

    Blocks a pass computes itself (a hybrid model's stems) may still be
    empty when the plan is made: only their rows and width are needed, and
    their tensors when the join runs.
    """

    def __init__(self, refs: list[tuple[Block, int, int] | None]):
        self.refs = refs
        self.width = max((w for ref in refs if ref is not None for _, _, w in [ref]), default=0)
        first = refs[0]
        self.shared = first[0] if (first is not None and first[0].rows == 1 and first[2] == first[0].width
                                   and all(ref is not None and ref[0] is first[0] for ref in refs)) else None
        self.sources: list[Block] = []
        self.kv_index: list[int] = []       # [N * width]: positions in zero slot + sources, concatenated
        self.row_index: list[int] = []      # [N]: rows in zero slot + sources
        if self.shared is None:
            self._index()

    def _index(self) -> None:
        kv_at, row_at = {}, {}
        kv, row = 1, 1        # slot 0 is the zero slot
        for ref in self.refs:
            if ref is not None and id(ref[0]) not in kv_at:
                block = ref[0]
                kv_at[id(block)], row_at[id(block)] = kv, row
                self.sources.append(block)
                kv, row = kv + block.rows * block.width, row + block.rows
        for ref in self.refs:
            if ref is None:
                self.kv_index += [0] * self.width
                self.row_index.append(0)
                continue
            block, r, w = ref
            end = kv_at[id(block)] + (r + 1) * block.width
            self.kv_index += [0] * (self.width - w) + list(range(end - w, end))
            self.row_index.append(row_at[id(block)] + r)

    def padding(self) -> list[int]:
        """[N * width]: 1 where a joined position holds a real key."""
        out = []
        for ref in self.refs:
            w = 0 if ref is None else ref[2]
            out += [0] * (self.width - w) + [1] * w
        return out


class _RecurrentStateTaken:
    """A joined layer's update_recurrent_state: the pass's final states are taken as they are.

    transformers' layer copies them into the tensor it started from, which
    is why a join once gathered every row's starting states into fresh
    memory: 18 layers x 50 rows of a pass of 32 continuing the pinned head,
    15 MB at the tiny width and most of a gigabyte at 0.8B in FP32, cloned
    before the pass and copied over after it. transformers' PyTorch delta
    rules (chunked and recurrent) return their final states in new memory
    and only read the starting ones, so the starting states can be a view
    of a kept entry and nothing is copied. fla makes its inputs contiguous
    before its kernels see them: on that path a view of one entry N times
    is still copied, inside the forward, into memory of fla's own (once,
    not twice), and one row's view, which would be the entry itself, is
    never handed out (_joined_states clones it).
    """

    # It holds the layer's dicts, not the layer: the layer holds it, and a cycle would keep each pass's
    # joined cache (keys and values of every row) alive until a full collection, which a worker's
    # frozen heap makes rare (host_bench's hits case took twice the host time).
    def __init__(self, layer):
        self.states, self.initialized = layer.recurrent_states, layer.is_recurrent_states_initialized

    def __call__(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        self.states[state_idx] = recurrent_states
        self.initialized[state_idx] = True
        return recurrent_states


def _own_dicts(layer) -> None:
    # copy.copy shares the per-state flag dicts; a pass updates them in place.
    for name, value in vars(layer).items():
        if isinstance(value, dict):
            setattr(layer, name, dict(value))
