"""transformers' progress bars, off while we load or build a model.

"Loading weights: 100%|...|" on every load is noise in a service log and in a
caller's terminal; the daemon logs one line per event instead, and
load_model logs what loaded and how long it took.
"""
import contextlib


@contextlib.contextmanager
def no_progress_bars():
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
