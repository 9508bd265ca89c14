"""A pass's inputs, built on the host as plain lists and sent to the device in one copy.

Filling a padded tensor row by row costs a copy per row (a kernel launch
each on a GPU), and a tensor made on the device from a list is a blocking
copy. So a pass lays its rows out as flat Python lists (ids, segments,
positions, readout positions, cache gathers), hands them all to one
``Upload``, and gets 1-D device tensors back; masks are then computed from
segments and positions on the device, with a few tensor ops per pass.
"""
from dataclasses import dataclass, field

import torch

PAD_SEGMENT = -1     # a padded position's segment: no query reads it as a key


class Upload:
    """Integer lists of one pass, copied to the device together (stream.upload)."""

    def __init__(self):
        self._arrays: list[list[int]] = []
        self._sent: list[torch.Tensor] | None = None

    def add(self, values: list[int]) -> int:
        """Register a list; its tensor is ``sent[handle]`` once sent."""
        self._arrays.append(values)
        return len(self._arrays) - 1

    def send(self, stream) -> "Upload":
        self._sent = stream.upload(*self._arrays)
        return self

    def __getitem__(self, handle: int) -> torch.Tensor:
        return self._sent[handle]


@dataclass
class Grid:
    """The rows of one forward: ids, segments (0 shared, k a branch, -1 padding) and positions.

    Rows are padded to the widest, after their tokens (right) or before
    them (left: a row's last token sits at the end, where a recurrent state
    is read).
    """
    pad_id: int
    left: bool = False
    rows: list[tuple[list[int], list[int], list[int]]] = field(default_factory=list)
    reads: list[tuple[int, int]] = field(default_factory=list)    # (row, column before padding), in order

    def add(self, ids: list[int], seg: list[int], pos: list[int]) -> int:
        self.rows.append((ids, seg, pos))
        return len(self.rows) - 1

    def read(self, row: int, column: int) -> None:
        self.reads.append((row, column))

    @property
    def width(self) -> int:
        return max(len(ids) for ids, _, _ in self.rows)

    def register(self, upload: Upload) -> "Sent":
        """Add the grid's flat lists to a pass's upload."""
        width = self.width
        ids, seg, pos = [], [], []
        for i, s, p in self.rows:
            pad = width - len(i)
            if self.left:
                ids += [self.pad_id] * pad + i
                seg += [PAD_SEGMENT] * pad + s
                pos += [0] * pad + p
            else:
                ids += i + [self.pad_id] * pad
                seg += s + [PAD_SEGMENT] * pad
                pos += p + [0] * pad
        shift = (lambda r: width - len(self.rows[r][0])) if self.left else (lambda r: 0)
        gather = [r * width + shift(r) + c for r, c in self.reads]
        return Sent(len(self.rows), width, upload.add(ids), upload.add(seg), upload.add(pos), upload.add(gather),
                    upload)


@dataclass
class Sent:
    """A grid's tensors on the device, [rows, width], once its upload is sent."""
    n: int
    width: int
    _ids: int
    _seg: int
    _pos: int
    _gather: int
    upload: Upload

    @property
    def ids(self) -> torch.Tensor:
        return self.upload[self._ids].view(self.n, self.width)

    @property
    def seg(self) -> torch.Tensor:
        return self.upload[self._seg].view(self.n, self.width)

    @property
    def pos(self) -> torch.Tensor:
        return self.upload[self._pos].view(self.n, self.width)

    @property
    def gather(self) -> torch.Tensor:
        return self.upload[self._gather]

    @property
    def padded_tokens(self) -> int:
        return self.n * self.width


def gather_rows(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Hidden states at flat positions [N*L] of [N, L, d]."""
    # A model spread over GPUs returns its states on the last one, not where the inputs went.
    if index.device != hidden.device:
        index = index.to(hidden.device, non_blocking=True)
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
