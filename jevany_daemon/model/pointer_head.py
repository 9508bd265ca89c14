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

    def forward(self, decide: torch.Tensor, options: torch.Tensor) -> torch.Tensor:
        """decide: [d]; options: [K, d] -> logits [K]. Inputs are cast to fp32 first."""
        q = self.q(decide.float())
        k = self.k(options.float())
        logits = (k @ q) / math.sqrt(self.head_dim)
        if self.residual is not None:
            logits = logits + self.residual(k * q).squeeze(-1)
        return logits
