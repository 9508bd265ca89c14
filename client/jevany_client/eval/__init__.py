"""jevany-eval: run a labelled suite through daemons, resumably, and report how well it decides.

evaluate.py  one run: read the suite, send what is not done yet, then report (and compare, plot)
suite.py     the suite file: one decide body per line, and the answer each labelled question expects
shards.py    which items one array task of a cluster's scheduler runs
results.py   RESULTS.jsonl: one line per finished item, appended as answers arrive, read back to resume
runner.py    sending the suite: N requests in flight over one AsyncJevClient
progress.py  the progress bar on stderr: items done, rate, ETA, errors and retries
private.py   --serve: a daemon of the run's own on a private ipc socket, drained at exit
metrics.py   accuracy, NLL, Brier and ECE, with bootstrap intervals over items
report.py    REPORT.json and its printed summary
compare.py   two results files of one suite side by side: what changed, and whether it matters
plot.py      the reliability diagram
merge.py     jevany-eval merge: the results files of a suite's shards joined into one
errors.py    EvalError: what jevany-eval refuses, printed as is
"""

from .errors import EvalError
from .evaluate import Options, evaluate

__all__ = ["EvalError", "Options", "evaluate"]
