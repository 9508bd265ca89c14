"""A media request's one forward pass: its files, then its prompt, through the whole multimodal model.

Media requests run alone (batching.py keeps them out of batches) and never
through the prefix cache (their prompt's keys depend on the pixels). The
prompt is the one the readout would read anyway, the prefix and the one
question's branch; the model's processor puts the media placeholders first,
so the readout reads the same positions of the prompt, shifted by where it
starts (model/multimodal.py).
"""
import torch

from jevany_client.errors import InvalidRequestError

from jevany_daemon.model.multimodal import MediaError, media_hidden_states

from .prompts import Encoded


def media_forward(model, encoded: Encoded, media: list[tuple[str, str]]) -> tuple[torch.Tensor, int]:
    """→ (hidden states at the readout positions, tokens the pass ran), like a layout's forward."""
    (branch,) = encoded.branches      # a media request holds exactly one question
    prompt = list(encoded.prefix) + list(branch.tokens)
    try:
        done = media_hidden_states(model, prompt, media)
    except MediaError:
        # The checker opened this file; a decoder that still fails on it is the file's fault.
        raise InvalidRequestError("media file could not be validated") from None
    start = done.prompt_start + len(encoded.prefix)
    positions = torch.tensor([start + p for p in branch.readout], device=done.hidden.device)
    return done.hidden[0].index_select(0, positions), int(done.input_ids.shape[1])
