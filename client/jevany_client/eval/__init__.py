"""jevany-eval: run a labelled suite through daemons, resumably, and report how well it decides.

suite (the input), results (the append-only log), runner (sending), metrics,
report, compare and plot; evaluate ties them into one run.
"""

from .errors import EvalError
from .evaluate import Options, evaluate

__all__ = ["EvalError", "Options", "evaluate"]
