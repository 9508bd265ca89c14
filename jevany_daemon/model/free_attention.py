"""Attention made free, for the simulated accelerator (engine/stream.py SimulatedStream).

The simulated accelerator answers one question: with the device's time
fixed, what does the host still cost? On a CPU, attention over a pass of 32
packed rows is O(L^2) work that a GPU does in parallel, and it would swamp
the host's share. So for the simulation every full-attention layer's
attention becomes one view of its queries: its output has the right shape
and no meaning, and what the host pays for the rest of the layer (its
kernel launches, on CUDA) is unchanged. Linear-attention layers are left as
they are. Benchmarks and tests only: answers are nonsense.
"""
from transformers import AttentionInterface

NAME = "jevany_free"


def _free(module, query, key, value, attention_mask, **kwargs):
    # query [B, heads, L, d] -> the [B, L, heads, d] an attention function returns, at the cost of a view
    return query.transpose(1, 2), None


def make_attention_free(model) -> None:
    """Switch a loaded DecisionModel's attention to the free one."""
    AttentionInterface.register(NAME, _free)
    model.causal_lm.set_attn_implementation(NAME)
