"""date_facts: JevAny's day counts between the dates of a state, added before encoding."""
import pytest

from jevany_client.errors import ContextLengthError
from jevany_daemon.engine.date_facts import TooLong, date_facts, find_dates, with_date_facts

QUESTIONS = {"q": {"type": "noul", "instructions": "is the parcel late?"}}


def test_sentences_after_before_and_singular():
    assert date_facts("Shipped July 22, 2026; due August 3, 2026.") == \
        "August 3, 2026 is 12 days after July 22, 2026."
    assert date_facts("due 2026-08-03, shipped 2026-07-22") == "2026-07-22 is 12 days before 2026-08-03."
    assert date_facts("2026-03-01 then 2026-03-02") == "2026-03-02 is 1 day after 2026-03-01."
    assert date_facts("2026-03-02 then 2026-03-01") == "2026-03-01 is 1 day before 2026-03-02."


def test_same_day_under_two_spellings():
    assert date_facts("March 1, 2026 or 2026-03-01") == "2026-03-01 is the same day as March 1, 2026."


def test_every_pair_in_order_of_first_appearance_joined_by_one_space():
    text = "a 2026-01-10 b January 1, 2026 c 2026-01-10 d 2026-01-31"
    assert date_facts(text) == (
        "January 1, 2026 is 9 days before 2026-01-10. "
        "2026-01-31 is 21 days after 2026-01-10. "
        "2026-01-31 is 30 days after January 1, 2026."
    )


def test_impossible_dates_and_near_misses_are_skipped():
    text = ("February 30, 2026, 2026-13-01, 0000-01-01, 12026-01-01, 2026-01-015, Feb 3, 2026, "
            "march 3, 2026, x2026-01-01, March 3 2026, 2026-02-28, February 28, 2026")
    assert [raw for raw, _ in find_dates(text)] == ["2026-02-28", "February 28, 2026"]
    assert date_facts("June 5, 2026 and June 31, 2026") == ""     # one real date: nothing to compare


def test_a_one_digit_day_and_a_leap_day():
    assert date_facts("February 29, 2028 vs March 1, 2028") == "March 1, 2028 is 1 day after February 29, 2028."


@pytest.mark.parametrize("state", [None, "", "no dates", "only 2026-01-01", {"d": "2026-01-01"}, [1, True], 3.5])
def test_fewer_than_two_dates_leave_the_state_as_it_was(state):
    assert with_date_facts(state) is state


def test_dict_list_and_string_states():
    facts = "2026-01-03 is 2 days after 2026-01-01."
    state = {"order": {"placed": "2026-01-01", "events": ["shipped 2026-01-03"]}}
    assert with_date_facts(state) == {**state, "date_facts": facts}     # found in nested values too
    assert with_date_facts(["2026-01-01", {"seen": "2026-01-03"}]) == \
        ["2026-01-01", {"seen": "2026-01-03"}, {"date_facts": facts}]
    assert with_date_facts("from 2026-01-01 to 2026-01-03") == f"from 2026-01-01 to 2026-01-03\n\ndate_facts: {facts}"


def test_the_budget_stops_a_state_of_many_dates():
    many = " ".join(f"2026-01-{d:02d}" for d in range(1, 29))
    assert len(date_facts(many).split(". ")) == 28 * 27 // 2
    with pytest.raises(TooLong):
        date_facts(many, max_chars=1000)


# -- in the engine ---------------------------------------------------------------------------

STATE = {"shipped": "July 22, 2026", "due": "August 3, 2026"}
SENTENCE = "August 3, 2026 is 12 days after July 22, 2026."


def test_the_choice_prompt_carries_the_facts_only_when_on(make_engine):
    on, off = make_engine(date_facts=True), make_engine()
    body = {"state": STATE, "questions": {"q": {"type": "choice", "criteria": {"late": None, "on time": None}}}}
    with_facts, without = on.admit(body), off.admit(body)
    assert with_facts.request.state == {**STATE, "date_facts": SENTENCE}
    assert SENTENCE in on.encoder.prompt(with_facts.request, with_facts.request.questions[0])
    assert SENTENCE not in off.encoder.prompt(without.request, without.request.questions[0])
    assert with_facts.encoded.prefix != without.encoded.prefix
    a, b = on.score([with_facts])[0], off.score([without])[0]
    assert a["usage"]["input_tokens"] > b["usage"]["input_tokens"]
    assert a["answers"]["q"]["probabilities"] != b["answers"]["q"]["probabilities"]
    assert on.describe()["date_facts"] is True and off.describe()["date_facts"] is False


def test_the_native_prompt_carries_them_too(make_engine):
    on, off = make_engine("qwen3", "pointer", date_facts=True), make_engine("qwen3", "pointer")
    tokenizer = on.model.tokenizer
    body = {"state": "Shipped 2026-07-22, due 2026-08-03.", "questions": QUESTIONS}
    text = tokenizer.decode(list(on.admit(body).encoded.prefix))
    assert text.endswith("date_facts: 2026-08-03 is 12 days after 2026-07-22.")
    assert "date_facts" not in tokenizer.decode(list(off.admit(body).encoded.prefix))


def test_a_state_whose_facts_cannot_fit_is_refused_before_encoding(make_engine):
    engine = make_engine("qwen3", "pointer", date_facts=True, max_state_tokens=64)
    many = " ".join(f"2026-01-{d:02d}" for d in range(1, 29))
    with pytest.raises(ContextLengthError, match=r"^state exceeds 64 tokens: at least \d+ with its date facts$"):
        engine.admit({"state": many, "questions": QUESTIONS})
