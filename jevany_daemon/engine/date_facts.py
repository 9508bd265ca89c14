"""JevAny's date preprocessing (JEVANY_DATE_FACTS=1): the day count between every pair of dates in a state.

Models are poor at calendar arithmetic, so the server does it for them: every
absolute date in the state's rendered text ("March 4, 2026" or "2026-03-04"),
once per distinct spelling, in order of first appearance, and for each pair a
sentence such as "March 18, 2026 is 14 days after March 4, 2026." The
sentences join the state as a `date_facts` field (or paragraph), so every
prompt style and readout sees them.
"""
import datetime
import re
from typing import Any

from jevany_client.render import render

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
_MONTH_NUMBER = {name: i for i, name in enumerate(MONTHS, 1)}
# Month names are matched as written (capitalised), as JevAny does.
_DATE = re.compile(
    r"\b(?P<month>" + "|".join(MONTHS) + r") (?P<day>[0-9]{1,2}), (?P<year>[0-9]{4})\b"
    r"|\b(?P<iy>[0-9]{4})-(?P<im>[0-9]{2})-(?P<id>[0-9]{2})\b"
)


class TooLong(ValueError):
    """The sentences would exceed the caller's character budget (pairs grow with the square of the dates)."""

    def __init__(self, chars: int):
        super().__init__(f"date facts exceed {chars} characters")
        self.chars = chars


def find_dates(text: str) -> list[tuple[str, datetime.date]]:
    """(raw text, date) of each distinct spelling, in order of first appearance; impossible dates skipped."""
    found: dict[str, datetime.date] = {}
    for m in _DATE.finditer(text):
        raw = m.group(0)
        if raw in found:
            continue
        try:
            if m.group("month"):
                date = datetime.date(int(m.group("year")), _MONTH_NUMBER[m.group("month")], int(m.group("day")))
            else:
                date = datetime.date(int(m.group("iy")), int(m.group("im")), int(m.group("id")))
        except ValueError:      # February 30, 2026-13-01, year 0000
            continue
        found[raw] = date
    return list(found.items())


def _sentence(earlier: tuple[str, datetime.date], later: tuple[str, datetime.date]) -> str:
    # "earlier" and "later" are positions in the text, not in time.
    n = (later[1] - earlier[1]).days
    if n == 0:
        return f"{later[0]} is the same day as {earlier[0]}."
    unit = "day" if abs(n) == 1 else "days"
    return f"{later[0]} is {abs(n)} {unit} {'after' if n > 0 else 'before'} {earlier[0]}."


def date_facts(text: str, max_chars: int | None = None) -> str:
    """One sentence per pair of dates in text, joined by spaces; "" with fewer than two dates.

    max_chars bounds the result: a state naming thousands of dates would make
    millions of sentences, so building stops (TooLong) once past the budget.
    """
    dates = find_dates(text)
    sentences, chars = [], 0
    for i in range(len(dates)):
        for j in range(i + 1, len(dates)):
            sentence = _sentence(dates[i], dates[j])
            chars += len(sentence) + 1
            if max_chars is not None and chars > max_chars:
                raise TooLong(chars)
            sentences.append(sentence)
    return " ".join(sentences)


def with_date_facts(state: Any, max_chars: int | None = None) -> Any:
    """The state with its date facts added, or unchanged when it holds fewer than two dates."""
    facts = date_facts(render(state), max_chars)
    if not facts:
        return state
    if isinstance(state, dict):
        return {**state, "date_facts": facts}
    if isinstance(state, list):
        return [*state, {"date_facts": facts}]
    return f"{state}\n\ndate_facts: {facts}"
