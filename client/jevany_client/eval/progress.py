"""The progress bar: items done of the suite, rate, ETA, errors and retries, on stderr.

rich.progress draws it: rich is already installed with typer (the command
line's library), so the bar costs no new dependency. Off a terminal rich
draws only the final state, so logs stay readable.

Its rate is the run's own (RunSummary.rate: items finished by this run over
the seconds from its first request to its last outcome), the figure the
printed summary gives too, not rich's estimate over a window; the ETA is
what is left at that rate.
"""

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
from rich.text import Text

from .runner import RunSummary, rate_text


def clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        return Text(rate_text(task.fields["rate"]))


class _Remaining(ProgressColumn):
    def render(self, task) -> Text:
        rate, left = task.fields["rate"], task.total - task.completed
        return Text("-:--:--" if rate is None else clock(left / rate))


class ProgressBar:
    """A context manager; update(summary) after each outcome."""

    def __init__(self, total: int, already: int, enabled: bool = True, console: Console | None = None):
        self._progress = Progress(
            TextColumn("eval"), BarColumn(), MofNCompleteColumn(), _Rate(), TextColumn("ETA"),
            _Remaining(), TextColumn("{task.fields[errors]} errors, {task.fields[retried]} retried"),
            console=console or Console(stderr=True), disable=not enabled,
        )
        self._task = self._progress.add_task("eval", total=total, completed=already, errors=0, retried=0, rate=None)
        self._already = already

    def update(self, summary: RunSummary) -> None:
        self._progress.update(self._task, completed=self._already + summary.finished, rate=summary.rate(),
                              errors=sum(summary.errors.values()), retried=sum(summary.retried.values()))

    def __enter__(self) -> "ProgressBar":
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._progress.stop()
