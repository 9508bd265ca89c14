"""The progress bar: items done of the suite, rate, ETA, errors and retries, on stderr.

rich.progress draws it: rich is already installed with typer (the command
line's library), so the bar costs no new dependency. Off a terminal rich
draws only the final state, so logs stay readable.
"""

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from .runner import RunSummary


class _Rate(ProgressColumn):
    def render(self, task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-- items/s" if speed is None else f"{speed:,.1f} items/s")


class ProgressBar:
    """A context manager; update(summary) after each outcome."""

    def __init__(self, total: int, already: int, enabled: bool = True):
        self._progress = Progress(
            TextColumn("eval"), BarColumn(), MofNCompleteColumn(), _Rate(), TextColumn("ETA"),
            TimeRemainingColumn(), TextColumn("{task.fields[errors]} errors, {task.fields[retried]} retried"),
            console=Console(stderr=True), disable=not enabled,
        )
        self._task = self._progress.add_task("eval", total=total, completed=already, errors=0, retried=0)
        self._already = already

    def update(self, summary: RunSummary) -> None:
        self._progress.update(self._task, completed=self._already + summary.finished,
                              errors=sum(summary.errors.values()), retried=sum(summary.retried.values()))

    def __enter__(self) -> "ProgressBar":
        self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._progress.stop()
