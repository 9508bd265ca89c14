"""A pass's inputs, built on the host as plain lists and sent to the device in one copy.

Filling a padded tensor row by row costs a copy per row (a kernel launch
each on a GPU), and a tensor made on the device from a list is a blocking
copy. So a pass lays its rows out as flat Python lists (ids, segments,
positions, readout positions, cache gathers), hands them all to one
``Upload``, and gets 1-D device tensors back; masks are then computed from
segments and positions on the device, with a few tensor ops per pass.
"""
from dataclasses import dataclass, field
from typing import Callable

import torch

PAD_SEGMENT = -1     # a padded position's segment: no query reads it as a key
# A packed row may hold several groups (a prefix and its branches: segments 0, 1, 2...); the j-th
# group of a row has its segments offset by j * GROUP_SEGMENTS, so a query finds its own group's
# prefix by rounding its segment down (masks.py) and never sees another group.
GROUP_SEGMENTS = 1 << 20


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

    def values(self, handle: int) -> list[int]:
        """A registered list as the host built it (sent or not)."""
        return self._arrays[handle]


@dataclass
class Grid:
    """The rows of one forward: ids, segments (0 shared, k a branch, -1 padding; offset by
    GROUP_SEGMENTS per group in a packed row) and positions.

    Rows are padded to the widest, after their tokens (right) or before
    them (left: a row's last token sits at the end, where a recurrent state
    is read).
    """
    pad_id: int
    left: bool = False
    rounded: Callable[[int], int] | None = None     # widest row -> the width rows are padded to (None: it)
    rows: list[tuple[list[int], list[int], list[int]]] = field(default_factory=list)
    reads: list[tuple[int, int]] = field(default_factory=list)    # (row, column before padding), in order

    def add(self, ids: list[int], seg: list[int], pos: list[int]) -> int:
        self.rows.append((ids, seg, pos))
        return len(self.rows) - 1

    def read(self, row: int, column: int) -> None:
        self.reads.append((row, column))

    @property
    def width(self) -> int:
        widest = max(len(ids) for ids, _, _ in self.rows)
        return widest if self.rounded is None else self.rounded(widest)

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
class _Group:
    ids: list[int]
    seg: list[int]
    pos: list[int]
    key: object           # groups share a row only with groups of the same key
    leader: bool          # starts a row of its own, at column 0


class Packing:
    """Groups packed into the rows of one grid, first fit by decreasing length.

    A group (a prefix, segment 0, then its branches, 1, 2...) shares a row
    with others that fit beside it within the widest group's width, so a
    batch of short and long prompts pays for less padding (on a device: fewer
    tokens computed; on any host: smaller masks and uploads) and the grid is
    never wider than one group; with a shape plan, within the width whose
    bucket holds the fewest tokens. Only groups of one key share a row (those
    continuing the same cached rows: a row has one cache ahead of it). A
    leader opens a row and sits at its column 0, where a pass's cache can cut
    out its keys in one span.
    """

    def __init__(self):
        self.groups: list[_Group] = []

    def add(self, ids: list[int], seg: list[int], pos: list[int], key=None, leader: bool = False) -> int:
        self.groups.append(_Group(ids, seg, pos, key, leader))
        return len(self.groups) - 1

    def grid(self, pad_id: int, row_width=None) -> tuple["Grid", list[tuple[int, int]], list]:
        """(the grid, (row, column) where each group starts, each row's key). The caller adds the reads,
        in its readout's order, each at its group's start plus its column within the group.

        row_width(widest, rows_at) -> the width rows are filled to (the widest group's by default):
        a shape plan's choice (ShapePlan.packing_width), asking rows_at(width) how many rows a width
        would take."""
        widest = max(len(g.ids) for g in self.groups)
        width = widest if row_width is None else row_width(widest, lambda w: len(self._placed(w)[0]))
        rows, keys = self._placed(width)
        grid, placed = Grid(pad_id), [(0, 0)] * len(self.groups)
        for r, members in enumerate(rows):
            ids, seg, pos = [], [], []
            for j, i in enumerate(members):
                g = self.groups[i]
                placed[i] = (r, len(ids))
                ids += g.ids
                seg += g.seg if j == 0 else [s + j * GROUP_SEGMENTS for s in g.seg]
                pos += g.pos
            grid.add(ids, seg, pos)
        return grid, placed, keys

    def _placed(self, width: int) -> tuple[list[list[int]], list]:
        """First fit by decreasing length into rows of `width`: each row's groups, and each row's key."""
        groups = self.groups
        order = sorted(range(len(groups)), key=lambda i: (not groups[i].leader, -len(groups[i].ids)))
        rows: list[list[int]] = []
        free: list[int] = []
        keys: list = []
        for i in order:
            g, size = groups[i], len(groups[i].ids)
            r = None if g.leader else next((r for r in range(len(rows)) if free[r] >= size and keys[r] == g.key),
                                           None)
            if r is None:
                r = len(rows)
                rows.append([])
                free.append(width)
                keys.append(g.key)
            rows[r].append(i)
            free[r] -= size
        return rows, keys


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

    def host_lists(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """ids, segments, positions (flat, n x width) and the gather index, as the host built them."""
        return tuple(self.upload.values(h) for h in (self._ids, self._seg, self._pos, self._gather))


def gather_rows(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Hidden states at flat positions [N*L] of [N, L, d]."""
    # A model spread over GPUs returns its states on the last one, not where the inputs went.
    if index.device != hidden.device:
        index = index.to(hidden.device, non_blocking=True)
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
