"""The decoder as every pass runs it: final hidden states, and on request the cache a later pass continues from.

Layouts, the prefix cache's passes and the shape plan's buckets all call it
the same way (layouts.Backbone): keyword arguments in, hidden states out,
the masks already built. Here they become what the decoder reads: a 4D mask
as it is, or one mask per layer type on hybrid models (masks.per_layer_type).
"""
from .masks import per_layer_type


class Decoder:
    """A model's backbone, called the way layouts call it. Passes own one (passes.Passes.backbone)."""

    def __init__(self, model):
        self.module = model.backbone       # what runs (a benchmark may compile it)
        self.layer_types = model.layer_types

    def __call__(self, *, attention_mask, padding_mask=None, return_cache: bool = False, cache=None, **inputs):
        """The decoder's final hidden states; with return_cache, and the cache a later pass continues from."""
        if attention_mask.dim() == 4:
            attention_mask = per_layer_type(self.layer_types, attention_mask, padding_mask)
        if cache is not None:
            inputs["cache"] = cache
        out = self.module(**inputs, attention_mask=attention_mask, use_cache=return_cache)
        return (out.last_hidden_state, out.cache) if return_cache else out.last_hidden_state
