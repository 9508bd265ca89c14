"""One entry of the mutation check's lists (scripts/mutations.py and the files it gathers): a line of a
file as it is and as a plausible bug would write it, and the tests that should catch it."""
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    before: str
    after: str
    tests: tuple[str, ...]


def m(name, path, before, after, *tests) -> Mutation:
    return Mutation(name, path, before, after, tests)
