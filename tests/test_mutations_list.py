"""scripts/mutations.py's list stays plantable: a refactor that moves or rewrites a mutated line fails
here, in `make test`, naming the entry to update, rather than at the next `make mutate`.

Only the list is checked (text searches, well under a second); no mutation is run.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))      # as when scripts/mutate.py runs: its list beside it
try:
    import mutate
    import mutations
finally:
    sys.path.remove(str(ROOT / "scripts"))


def test_every_mutation_plants_a_change_on_a_line_found_once_and_names_tests_that_exist():
    stale = {mu.name: found for mu in mutations.MUTATIONS if (found := mutate.problems(mu))}
    assert not stale, "update these entries of scripts/mutations.py: " + "; ".join(
        f"{name}: {', '.join(found)}" for name, found in stale.items())


def test_the_check_names_what_went_stale():
    # The check itself: a line gone, a line found twice, a no-op mutant, a test file or test that is not there.
    real = mutations.MUTATIONS[0]
    gone = mutations.m("gone", real.path, "    this line is in no file\n", "    pass\n", *real.tests)
    twice = mutations.m("twice", real.path, "\n", "\n\n", *real.tests)
    same = mutations.m("same", real.path, real.before, real.before, *real.tests)
    no_file = mutations.m("no file", real.path, real.before, real.after, "tests/nowhere/test_nothing.py")
    no_test = mutations.m("no test", real.path, real.before, real.after, real.tests[0] + "::test_that_is_not_there")
    assert "occurs 0 times" in mutate.problems(gone)[0]
    assert "not once" in mutate.problems(twice)[0]
    assert mutate.problems(same) == ["the mutated line is the original"]
    assert mutate.problems(no_file) == ["no test file tests/nowhere/test_nothing.py"]
    assert mutate.problems(no_test) == [f"no test test_that_is_not_there in {real.tests[0]}"]


def test_names_are_distinct_so_only_picks_what_it_means():
    names = [mu.name for mu in mutations.MUTATIONS]
    assert len(set(names)) == len(names), sorted({n for n in names if names.count(n) > 1})


def test_the_docstring_counts_the_mutations_held():
    stated = re.search(r"\((\d+) mutations:", mutations.__doc__)
    assert stated, "scripts/mutations.py's docstring no longer states how many mutations it holds"
    assert int(stated.group(1)) == len(mutations.MUTATIONS), "update the count in scripts/mutations.py's docstring"
