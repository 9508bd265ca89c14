"""How encoded requests become forward passes: rows, packed, shared or flat.

Rows: one causal row per question (shared prefix + branch), right-padded.
Exact on every architecture, recurrent layers included, because padding only
ever follows the real tokens.

Packed: one sequence per request (prefix once, then every branch) under a
block-causal 4D mask with positions restarting after the prefix; short
sequences share a row, each seeing only itself (pass_inputs.Packing). It
runs the shared state once, but it is only valid where a test proves it
equals rows.
The mask is additive float, never boolean: eager attention silently
misreads boolean 4D masks in the transformers version we pin.

Shared: two passes. The prefixes of the batch, left-padded (padding before
the first real token leaves a recurrent state at zero), fill a cache; each
question's row continues its request's prefix from it, right-padded. The
state runs once even on hybrid recurrent models, where packing is
impossible.

Batch-invariant (model/invariant.py): rows padded alone to a rounded width,
rows of one width together (in_runs), so that the attention computes each
run at its own width. Rows: one row a question, in a grid padded to the
widest, on any architecture. Flat: one row a request, packed (its prefix
once, then its branches), end to end in one sequence, none padded to
another's width; only where packed is proven (every layer but attention
reads one token at a time).

A layout works in two steps. ``prepare`` lays the batch out on the host and
adds its integer lists to the pass's one upload (pass_inputs.py; the
prefix cache's layouts may run the backbone once there, to pin the prompt's
head the first time);
``run`` then queues the forward(s) on the device from the uploaded tensors,
masks included, and returns the hidden states at the readout positions.
A job that is one forward over one grid, continuing nothing or every row
the same cached entry, says so (``single``): the shape plan may run it in a
bucket's fixed shape instead (replay.py).
Every mask is built here, so the decoder never builds one of its own (which
reads a device value to decide whether padding exists).

No layout builds a query row that may attend to no key: CUDA turns such a
row into NaN, which spreads into real tokens (masks.py). Right padding never
does (a padded query sees the real tokens before it); left padding and
packing give padded positions their own diagonal.
"""
import itertools
from typing import Callable, NamedTuple

import torch

from .cache_rows import Block, CacheKit, JoinPlan
from .masks import block_causal_mask, continued_block_causal_mask, padded_causal_mask
from .pass_inputs import PAD_SEGMENT, Grid, Packing, Sent, Upload, gather_rows
from .prompts import Encoded

# Architectures whose layouts a test proves equal to rows
# (tests/engine/test_parity.py). Hybrid recurrent models can never pack.
PACKED_PROVEN = frozenset({"qwen3"})
SHARED_PROVEN = frozenset({"qwen3", "qwen3_5_text"})

# Runs the decoder: keyword arguments in, final hidden states [N, L, d] out
# (with return_cache=True: and the decoder cache a later pass continues from).
# A 4D attention_mask comes with padding_mask, the 2D mask recurrent layers read.
Backbone = Callable[..., torch.Tensor]

FLAT_ROW = "flat"      # the stem every request of a flat pass shares: its one sequence (FlatLayout.shape)

# Batch-invariant passes: (width, rows) of each run of rows padded alone to one width, in the pass's order.
Runs = tuple[tuple[int, int], ...]


class Shape(NamedTuple):
    rows: int          # rows the request occupies in a branch pass
    width: int         # its longest row
    prefix: int = 0    # its prefix, when that runs in a pass of its own
    stem: object = None    # requests on one stem share one row of the pass (batching.Pending.stem)
    shared: int = 0        # the stem's tokens to compute, which that row holds once
    tails: int = 0         # what the request adds to that row after the stem


def padding_of(seg: torch.Tensor) -> torch.Tensor:
    """[N, L] 0/1: where a grid holds real tokens."""
    return (seg >= 0).long()


class Single(NamedTuple):
    """A pass of one forward over one grid (right-padded), every row continuing `continues` (a cached entry
    of one row, whole) or nothing: what a bucket of the shape plan can run in its stead."""
    sent: Sent
    continues: Block | None


class OneForward:
    """A prepared pass of one forward over a grid, under a causal (rows) or block-causal (packed) mask.

    runs (batch-invariant rows): (width, rows) of each run of rows that are padded alone to one width,
    in order; the attention computes each run at its own width (model/invariant.py)."""

    def __init__(self, sent: Sent, block_causal: bool, runs: Runs | None = None):
        self.sent, self.block_causal, self.runs = sent, block_causal, runs

    def single(self) -> Single:
        return Single(self.sent, None)

    def run(self, backbone: Backbone, dtype) -> tuple[torch.Tensor, int]:
        s = self.sent
        padding = padding_of(s.seg)
        mask = block_causal_mask(s.seg, dtype) if self.block_causal else padded_causal_mask(padding, dtype)
        extra = {} if self.runs is None else {"grid_runs": self.runs}
        hidden = backbone(input_ids=s.ids, attention_mask=mask, position_ids=s.pos, padding_mask=padding, **extra)
        return gather_rows(hidden, s.gather), s.padded_tokens


class Layout:
    """What every layout answers of a request: its shape in a batch and its real tokens (cost: both)."""

    def cost(self, enc: Encoded) -> tuple[Shape, int]:
        return self.shape(enc), self.real_tokens(enc)


class RowsLayout(Layout):
    name = "rows"

    def __init__(self, rounded: Callable[[int], int] | None = None):
        self.rounded = rounded      # the width a pass's rows are padded to, from its widest (batch-invariant)

    @staticmethod
    def shape(enc: Encoded) -> Shape:
        return Shape(len(enc.branches), max(enc.row_lengths))

    @staticmethod
    def real_tokens(enc: Encoded) -> int:
        return sum(enc.row_lengths)

    def prepare(self, encs: list[Encoded], pad_id: int, upload: Upload, backbone: Backbone = None) -> OneForward:
        grid = Grid(pad_id, rounded=self.rounded)
        if self.rounded is None:
            for e in encs:
                for b in e.branches:
                    row = [*e.prefix, *b.tokens]
                    r = grid.add(row, [1] * len(row), list(range(len(row))))
                    for p in b.readout:
                        grid.read(r, len(e.prefix) + p)
            return OneForward(grid.register(upload), block_causal=False)
        rows = [([*e.prefix, *b.tokens], [len(e.prefix) + p for p in b.readout]) for e in encs for b in e.branches]
        order, runs = in_runs([self.rounded(len(ids)) for ids, _ in rows])
        placed = {i: grid.add(rows[i][0], [1] * len(rows[i][0]), list(range(len(rows[i][0])))) for i in order}
        for i, (_, reads) in enumerate(rows):
            for column in reads:
                grid.read(placed[i], column)
        return OneForward(grid.register(upload), block_causal=False, runs=runs)


class FlatLayout(Layout):
    """Batch-invariant requests, each packed (its prefix once, then every branch, as packed passes hold it)
    and padded alone to a rounded width, laid end to end in one sequence, runs of one width together: no
    request is padded to another's width. Only where packed is proven (every layer but attention reads one
    token at a time); the attention computes each run of requests as rows under their own block-causal
    masks (model/invariant.py), so no mask spans the pass."""
    name = "flat"

    def __init__(self, rounded: Callable[[int], int]):
        self.rounded = rounded

    def shape(self, enc: Encoded) -> Shape:
        # Every request of a pass in its one sequence: priced as one row that each request widens by its
        # own tokens (batching._Cost's stems), so a batch costs the padding the pass holds, each request's rounding.
        tokens = self.rounded(enc.packed_length)
        return Shape(1, tokens, stem=FLAT_ROW, tails=tokens)

    @staticmethod
    def real_tokens(enc: Encoded) -> int:
        return enc.packed_length

    def prepare(self, encs: list[Encoded], pad_id: int, upload: Upload, backbone: Backbone = None) -> "FlatForward":
        packed = [_packed(e) for e in encs]
        order, runs = in_runs([self.rounded(len(ids)) for ids, _, _, _ in packed])
        ids, seg, pos, starts = [], [], [], {}
        for i in order:
            request_ids, request_seg, request_pos, _ = packed[i]
            pad = self.rounded(len(request_ids)) - len(request_ids)
            starts[i] = len(ids)
            ids += request_ids + [pad_id] * pad
            seg += request_seg + [PAD_SEGMENT] * pad
            pos += request_pos + [0] * pad
        grid = Grid(pad_id)
        grid.add(ids, seg, pos)
        for i, (_, _, _, reads) in enumerate(packed):
            for column in reads:
                grid.read(0, starts[i] + column)
        return FlatForward(grid.register(upload), runs)


class FlatForward(NamedTuple):
    """A prepared flat pass: one sequence of requests end to end (FlatLayout), and its runs."""
    sent: Sent
    runs: Runs

    def run(self, backbone: Backbone, dtype) -> tuple[torch.Tensor, int]:
        s = self.sent
        masks, at = [], 0
        for width, rows in self.runs:      # each run's requests as rows, each under its own block-causal mask
            masks.append(block_causal_mask(s.seg[0, at: at + rows * width].view(rows, width), dtype))
            at += rows * width
        # The 2D padding, not a 4D mask: transformers builds none for the batch-invariant attention.
        hidden = backbone(input_ids=s.ids, attention_mask=padding_of(s.seg), position_ids=s.pos, flat_runs=self.runs,
                          run_masks=tuple(masks))
        return gather_rows(hidden, s.gather), s.padded_tokens


def _packed(enc: Encoded) -> tuple[list[int], list[int], list[int], list[int]]:
    """A request as one packed sequence: ids, segments (0 its prefix, k its k-th branch), positions (every branch
    restarting after the prefix) and the columns its readout reads, in order."""
    p = len(enc.prefix)
    ids, seg, pos, reads = list(enc.prefix), [0] * p, list(range(p)), []
    for k, b in enumerate(enc.branches, 1):
        reads += [len(ids) + r for r in b.readout]
        ids += b.tokens
        seg += [k] * len(b.tokens)
        pos += range(p, p + len(b.tokens))
    return ids, seg, pos, reads


def in_runs(widths: list[int]) -> tuple[list[int], Runs]:
    """Batch-invariant rows by width (arrival order within one width), and the runs of that order."""
    order = sorted(range(len(widths)), key=widths.__getitem__)
    return order, tuple((w, len(list(same))) for w, same in itertools.groupby(widths[i] for i in order))


class PackedLayout(Layout):
    name = "packed"
    row_width = None       # with a shape plan, its choice of the width rows are packed to (Packing.grid)

    @staticmethod
    def shape(enc: Encoded) -> Shape:
        return Shape(1, enc.packed_length)

    @staticmethod
    def real_tokens(enc: Encoded) -> int:
        return enc.packed_length

    def prepare(self, encs: list[Encoded], pad_id: int, upload: Upload, backbone: Backbone = None) -> OneForward:
        packing, reads = Packing(), []
        for e in encs:
            ids, seg, pos, mine = _packed(e)
            reads.append(mine)
            packing.add(ids, seg, pos)
        grid, placed, _ = packing.grid(pad_id, self.row_width)      # short requests share rows
        for (r, at), mine in zip(placed, reads):
            for c in mine:
                grid.read(r, at + c)
        return OneForward(grid.register(upload), block_causal=True)


class SharedLayout(Layout):
    name = "shared"

    def __init__(self):
        self.kit: CacheKit | None = None      # learnt from the first prefix pass

    @staticmethod
    def shape(enc: Encoded) -> Shape:
        return Shape(len(enc.branches), max(len(b.tokens) for b in enc.branches), len(enc.prefix))

    @staticmethod
    def real_tokens(enc: Encoded) -> int:
        return enc.packed_length

    def prepare(self, encs: list[Encoded], pad_id: int, upload: Upload, backbone: Backbone = None):
        if all(len(e.branches) == 1 for e in encs):
            return RowsLayout().prepare(encs, pad_id, upload)    # nothing to share
        prefixes = Grid(pad_id, left=True)
        for e in encs:
            prefixes.add(list(e.prefix), [0] * len(e.prefix), list(range(len(e.prefix))))
        block = Block(len(encs), prefixes.width)      # filled by the prefix pass
        branches, refs = Grid(pad_id), []
        for i, e in enumerate(encs):
            for b in e.branches:
                r = branches.add(list(b.tokens), [1] * len(b.tokens), list(range(len(e.prefix),
                                                                                len(e.prefix) + len(b.tokens))))
                refs.append((block, i, len(e.prefix)))
                for p in b.readout:
                    branches.read(r, p)
        return Continued(self, prefixes.register(upload), block, branches.register(upload), JoinPlan(refs), upload)


class Continued:
    """A prefix pass, then a pass whose rows continue it (SharedLayout's two forwards)."""

    def __init__(self, layout: SharedLayout, prefixes: Sent, block: Block, branches: Sent, plan: JoinPlan,
                 upload: Upload):
        self.layout, self.prefixes, self.block, self.branches, self.plan = layout, prefixes, block, branches, plan
        self.index = Joined(plan, upload)

    def run(self, backbone: Backbone, dtype) -> tuple[torch.Tensor, int]:
        p = self.prefixes
        padding = padding_of(p.seg)
        # Left padding: a padded query has no real key before it, so it keeps its diagonal.
        _, cache = backbone(input_ids=p.ids, attention_mask=padded_causal_mask(padding, dtype), padding_mask=padding,
                            position_ids=p.pos, return_cache=True)
        kit = self.layout.kit = self.layout.kit or CacheKit(cache)
        filled = kit.block(cache)
        self.block.kv, self.block.conv, self.block.recurrent = filled.kv, filled.conv, filled.recurrent
        hidden = self.index.forward(backbone, kit, self.branches, dtype)
        return gather_rows(hidden, self.branches.gather), p.padded_tokens + self.branches.padded_tokens


class Joined:
    """A pass whose rows continue cached rows: the join's index lists in the upload, and its forward."""

    def __init__(self, plan: JoinPlan, upload: Upload):
        self.plan = plan
        self._kv = None if plan.shared is not None else upload.add(plan.kv_index)
        self._rows = None if plan.shared is not None else upload.add(plan.row_index)
        self._padding = upload.add(plan.padding())
        self.upload = upload

    def forward(self, backbone: Backbone, kit: CacheKit, grid: Sent, dtype, return_cache: bool = False):
        plan, up = self.plan, self.upload
        cache = kit.join(plan, None if self._kv is None else up[self._kv], None if self._rows is None else up[self._rows])
        cached = up[self._padding].view(len(plan.refs), plan.width)
        mask = continued_block_causal_mask(cached, grid.seg, dtype)
        return backbone(input_ids=grid.ids, attention_mask=mask, position_ids=grid.pos, padding_mask=padding_of(grid.seg),
                        cache=cache, return_cache=return_cache)
