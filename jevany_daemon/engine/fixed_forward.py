"""A pass in a bucket's fixed shape: its inputs in one static buffer, and a forward a CUDA graph can record.

For one bucket of the shape plan (rows x width, every row continuing the
pinned head or nothing) a ``FixedForward`` owns:

- one int64 buffer on the device, allocated once, whose address never
  changes: ids, segments and positions [rows x width] each, the readout's
  gather index [gathered], then the readout's own index lists. A pass's one
  upload fills it (stream.fill); padding rows and columns hold the pad token,
  segment -1 (a padded query sees only padding and its own diagonal: never
  a keyless row, so never NaN on CUDA) and position 0;
- the head's cached rows, copied once from the prefix cache, so nothing the
  cache does later (evict, drop after a failed pass, pin again) moves what
  a captured graph reads;
- ``forward()``: masks from the segments, the join of the head, the decoder,
  the gather and the readout, all from the buffer. Every op depends only on
  the bucket's shapes: no scalar read, no op whose output shape depends on
  values, no Python branch on a tensor's contents (the tests run it under a
  dispatch mode that fails on any of those). transformers is always handed
  its masks, so it never builds or inspects one.

``values`` lays a prepared pass (a layout's Single) out at the bucket's
shape on the host, as the buffer's one upload.
"""
import math

import torch

from .cache_rows import Block, CacheKit, JoinPlan
from .layouts import Backbone, Sent, padding_of
from .masks import block_causal_mask, continued_block_causal_mask
from .pass_inputs import PAD_SEGMENT, gather_rows
from .shape_plan import Bucket

# Tokens a prompt spends at least per position its readout reads: a choice or lm_token question reads
# one state after its whole branch (question, options, answer line); a pointer option its close token,
# after its open token and text. A bucket gathers rows x ceil(width / this); a pass reading more runs
# eagerly (counted as "readouts").
TOKENS_PER_READOUT = {"pointer": 4, "label": 16}


def gathered_capacity(bucket: Bucket, readout_kind: str) -> int:
    return bucket.rows * max(1, math.ceil(bucket.width / TOKENS_PER_READOUT[readout_kind]))


def own_copy(block: Block) -> Block:
    """A cached entry's rows in memory of the caller's own."""
    return Block(block.rows, block.width, *(None if t is None else t.clone()
                                            for t in (block.kv, block.conv, block.recurrent)))


class FixedForward:
    def __init__(self, bucket: Bucket, readout, readout_kind: str, backbone: Backbone, dtype, device,
                 pad_id: int, head: Block | None = None, kit: CacheKit | None = None):
        self.bucket, self.readout, self.backbone, self.dtype, self.pad_id = bucket, readout, backbone, dtype, pad_id
        self.gathered = gathered_capacity(bucket, readout_kind)
        cells = bucket.tokens
        sizes = [cells, cells, cells, self.gathered, *readout.fixed_sizes(self.gathered)]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self.buffer = torch.zeros(self.offsets[-1], dtype=torch.long, device=device)
        self.buffer[:cells] = pad_id
        self.buffer[cells:2 * cells] = PAD_SEGMENT
        self.head, self.kit = head, kit
        if head is not None:
            # Every row continues the whole head: a join viewing it (conv states copied afresh each pass,
            # inside the forward, as layers update them in place), its keys all real.
            self._join = JoinPlan([(head, 0, head.width)] * bucket.rows)
            self._cached = torch.ones(bucket.rows, head.width, dtype=torch.long, device=device)

    def _field(self, i: int) -> torch.Tensor:
        return self.buffer[self.offsets[i]:self.offsets[i + 1]]

    def forward(self) -> torch.Tensor:
        """The bucket's probabilities, in the readout's fixed layout, from what the buffer holds."""
        rows, width = self.bucket
        ids, seg, pos = (self._field(i).view(rows, width) for i in range(3))
        cache = None
        if self.head is None:
            mask = block_causal_mask(seg, self.dtype)
        else:
            cache = self.kit.join(self._join, None, None)
            mask = continued_block_causal_mask(self._cached, seg, self.dtype)
        hidden = self.backbone(input_ids=ids, attention_mask=mask, position_ids=pos, padding_mask=padding_of(seg),
                               cache=cache)
        fields = [self._field(i) for i in range(4, len(self.offsets) - 1)]
        return self.readout.fixed_probabilities(gather_rows(hidden, self._field(3)), *fields)

    def values(self, sent: Sent, readout_lists: list[list[int]]) -> list[int]:
        """A prepared grid (right-padded, sent.n x sent.width) and its readout lists at this bucket's shape."""
        rows, width = self.bucket
        n, w = sent.n, sent.width
        ids, seg, pos, gather = sent.host_lists()
        out: list[int] = []
        for flat, pad in ((ids, self.pad_id), (seg, PAD_SEGMENT), (pos, 0)):
            if w == width:
                out += flat
            else:
                tail = [pad] * (width - w)
                for r in range(0, n * w, w):
                    out += flat[r:r + w]
                    out += tail
            out += [pad] * ((rows - n) * width)
        out += gather if w == width else [g // w * width + g % w for g in gather]
        out += [0] * (self.gathered - len(gather))
        for values in readout_lists:
            out += values
        return out

    def warm_values(self) -> list[int]:
        """Inputs for a warm-up run: every position real (what tunes and compiles sees is the shape)."""
        rows, width = self.bucket
        start = 0 if self.head is None else self.head.width
        counts = [2] * (self.gathered // 3)
        lists = self.readout.fixed_lists(counts, self.gathered) or self.readout.fixed_lists([], self.gathered)
        out = [self.pad_id] * (rows * width) + [1] * (rows * width)
        out += list(range(start, start + width)) * rows
        out += [i % (rows * width) for i in range(self.gathered)]
        for values in lists:
            out += values
        return out
