"""Decoder caches row by row: take each request's row out of a batch cache, and put rows back together.

A batch of prefixes runs left-padded, so request i's real positions are the
last widths[i] of its row. Taken out, a row keeps only those (cloned, so it
does not pin the whole batch's memory). Put back together, rows are
left-padded again to the longest, with a 2D mask that marks the padding;
attention never reads a padded key, and recurrent states have no length.
Attention layers hold `keys` and `values` [B, heads, L, d]; linear-attention
layers hold `conv_states` and `recurrent_states`, dicts of [B, ...] tensors.
"""
import copy

import torch
import torch.nn.functional as F

_STATE_DICTS = ("conv_states", "recurrent_states")


def take_rows(cache, widths: list[int], ends: list[int] | None = None, rows: list[int] | None = None) -> list:
    """Single-row caches out of a batch cache: row rows[k]'s widths[k] positions ending at ends[k].

    rows defaults to every row in order, ends to the end of the cache (as in
    a left-padded batch). A row whose recurrent states matter must end
    there: a recurrent state holds only the last position.
    """
    ends = ends or [None] * len(widths)
    rows = list(range(len(widths))) if rows is None else rows
    return [_map_layers(cache, lambda t, i=i, w=w, e=e: _span(t, e, w)[i:i + 1].clone(),
                        lambda t, i=i: t[i:i + 1].clone()) for i, w, e in zip(rows, widths, ends)]


def _span(t: torch.Tensor, end: int | None, width: int) -> torch.Tensor:
    end = t.shape[2] if end is None else end
    return t[:, :, end - width:end]


def join_rows(rows: list, widths: list[int]) -> tuple[object, torch.Tensor]:
    """A batch cache of single-row caches, left-padded to the widest, and its [B, width] 0/1 mask.

    A row may be None (nothing cached, width 0) on models without recurrent
    layers: it is all padding.
    """
    width = max(widths)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, w in enumerate(widths):
        mask[i, width - w:] = 1
    present = next(r for r in rows if r is not None)

    def keys(parts, template):
        empty = template[:, :, :0]
        return torch.cat([F.pad(empty if t is None else t, (0, 0, width - w, 0)) for t, w in zip(parts, widths)])

    joined = copy.copy(present)
    joined.layers = []
    for k, layer in enumerate(present.layers):
        layers = [None if r is None else r.layers[k] for r in rows]
        layer = copy.copy(layer)
        if getattr(layer, "keys", None) is not None:
            layer.keys = keys([None if x is None else x.keys for x in layers], layer.keys)
            layer.values = keys([None if x is None else x.values for x in layers], layer.values)
        for name in _STATE_DICTS:
            states = getattr(layer, name, None)
            if isinstance(states, dict):
                if None in layers:
                    raise ValueError("a row without a cache cannot join rows that hold recurrent states")
                setattr(layer, name, {s: None if states[s] is None else torch.cat([getattr(x, name)[s] for x in layers])
                                      for s in states})
        _own_dicts(layer)
        joined.layers.append(layer)
    return joined, mask


def _map_layers(cache, kv, state):
    out = copy.copy(cache)
    out.layers = []
    for src in cache.layers:
        layer = copy.copy(src)
        if getattr(layer, "keys", None) is not None:
            layer.keys, layer.values = kv(src.keys), kv(src.values)
        for name in _STATE_DICTS:
            states = getattr(src, name, None)
            if isinstance(states, dict):
                setattr(layer, name, {s: None if t is None else state(t) for s, t in states.items()})
        _own_dicts(layer)
        out.layers.append(layer)
    return out


def _own_dicts(layer) -> None:
    # copy.copy shares the per-state flag dicts; a later pass updates them in place.
    for name, value in vars(layer).items():
        if isinstance(value, dict) and name not in _STATE_DICTS:
            setattr(layer, name, dict(value))
