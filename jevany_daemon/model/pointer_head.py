"""The trained pointer head of JevAny checkpoints: DECIDE queries each option's close token."""
import math

import torch
from torch import nn


class PointerHead(nn.Module):
    """q(h[DECIDE]) . k(h[/OPT_j]) / sqrt(dp), plus an optional residual MLP on k_j * q.

    State-dict keys follow JevAny's head.pt: ``q.*``, ``k.*`` and, with a
    residual, ``residual.0.*`` / ``residual.2.*``.
    """

    def __init__(self, hidden_size: int, head_dim: int = 256, residual_dim: int = 0):
        super().__init__()
        self.head_dim = head_dim
        self.q = nn.Linear(hidden_size, head_dim)
        self.k = nn.Linear(hidden_size, head_dim)
        self.residual = None
        if residual_dim > 0:
            self.residual = nn.Sequential(
                nn.Linear(head_dim, residual_dim), nn.GELU(), nn.Linear(residual_dim, 1)
            )

    def forward(self, decide: torch.Tensor, options: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        """Score many questions at once.

        decide: [Q, d], one DECIDE state per question; options: [K, d], the
        option-close states question by question; owners: [K], the question
        of each option. Returns [K] logits. Hidden states are cast to fp32.
        """
        q = self.q(decide.float()).index_select(0, owners)
        k = self.k(options.float())
        logits = (k * q).sum(-1) / math.sqrt(self.head_dim)
        if self.residual is not None:
            logits = logits + self.residual(k * q).squeeze(-1)
        return logits
