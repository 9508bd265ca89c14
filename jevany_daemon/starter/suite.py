"""The starter suite: support tickets whose routing, urgency and priority follow from what they say.

Every item is a decide body exactly as a client sends it, plus ``labels``
{question id: expected answer} (an option key for choice, a bool for noul, a
level index for score): the suite format of ``jevany-eval``. The rules that
make a label are written once, here, so a label can always be recomputed
from its item's state (``expected``).

A ticket is a few sentences drawn from small phrase tables: one names the
product area (which team routes it), at most one says how urgent it is, one
may ask for the money back, and some are filler. The customer's plan decides
priority together with the urgency. Held-out items are drawn with another
seed and never repeat a training state.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

# Product area -> sentences that name it. The team question's answer.
AREAS = {
    "billing": ("I was charged twice this month", "the invoice shows the wrong amount",
                "my card payment keeps failing", "the price on my bill went up"),
    "shipping": ("my parcel never arrived", "the courier left the package at the wrong address",
                 "tracking has not moved for a week", "the delivery came damaged"),
    "accounts": ("I cannot log in any more", "the password reset email never comes",
                 "someone changed my username", "my account was locked"),
    "technical": ("the app crashes when I open it", "sync fails with an error",
                  "the export button does nothing", "the screen stays black after the update"),
}
# Urgency levels, lowest first, with what a ticket says at each (normal: nothing).
URGENCY = ("low", "normal", "high", "critical")
URGENCY_PHRASES = {
    0: ("no rush, whenever you can", "just letting you know"),
    2: ("I need this fixed today", "our deadline is tomorrow morning"),
    3: ("nothing works for any of our users", "this is a full outage for the whole company"),
}
REFUND_PHRASES = ("please refund me", "I want my money back")
FILLER = ("hello team", "thanks in advance", "I have been a customer for years", "see the screenshot",
          "my colleague asked me to write", "best regards")
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea",
         "Mo", "Nia", "Omar", "Pia", "Raj", "Sol", "Tom", "Uma")

QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
             "criteria": {area: None for area in AREAS}},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": list(URGENCY)},
    "refund": {"type": "noul", "instructions": "Does the customer ask for their money back?"},
    "priority": {"type": "choice", "instructions": "Which queue should it join?",
                 "criteria": {"now": None, "today": None, "later": None}},
}

TRAIN_SEED, HELDOUT_SEED = 0, 1


PLAN_POINTS = {"free": -1, "pro": 0, "enterprise": 1}


def priority(urgency: int, plan: str) -> str:
    """Urgency level plus the plan's points: 3 or more goes now, 0 or less later, the rest today."""
    points = urgency + PLAN_POINTS[plan]
    return "now" if points >= 3 else "later" if points <= 0 else "today"


def _facts(rng: random.Random) -> dict:
    return {"area": rng.choice(tuple(AREAS)), "urgency": rng.randrange(len(URGENCY)),
            "refund": rng.random() < 0.4, "plan": rng.choice(tuple(PLAN_POINTS))}


def _ticket(rng: random.Random, facts: dict) -> str:
    sentences = [rng.choice(AREAS[facts["area"]])]
    if facts["urgency"] in URGENCY_PHRASES:
        sentences.append(rng.choice(URGENCY_PHRASES[facts["urgency"]]))
    if facts["refund"]:
        sentences.append(rng.choice(REFUND_PHRASES))
    sentences += rng.sample(FILLER, rng.randint(0, 2))
    rng.shuffle(sentences)
    return ". ".join(s[0].upper() + s[1:] for s in sentences) + "."


def _item(rng: random.Random) -> dict:
    facts = _facts(rng)
    state = {"customer": rng.choice(NAMES), "plan": facts["plan"], "ticket": _ticket(rng, facts)}
    asked = rng.sample(tuple(QUESTIONS), rng.randint(2, len(QUESTIONS)))
    body = {"state": state, "questions": {qid: QUESTIONS[qid] for qid in asked}}
    return {**body, "labels": {qid: expected(state)[qid] for qid in asked}}


def expected(state: dict) -> dict:
    """Every question's answer, read back from a state's own words (the rules above, inverted)."""
    ticket = state["ticket"].lower()
    area = [a for a, sentences in AREAS.items() if any(s.lower() in ticket for s in sentences)]
    urgency = [level for level, phrases in URGENCY_PHRASES.items() if any(p.lower() in ticket for p in phrases)]
    if len(area) != 1 or len(urgency) > 1:
        raise ValueError(f"ambiguous ticket: {state['ticket']!r}")
    level = urgency[0] if urgency else 1
    return {"team": area[0], "urgency": level, "refund": any(p.lower() in ticket for p in REFUND_PHRASES),
            "priority": priority(level, state["plan"])}


def state_key(item: dict) -> str:
    return json.dumps(item["state"], sort_keys=True)


def generate(n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
    """n items with distinct states, none of whose states is in exclude; the same n and seed, the same items."""
    rng, items, seen = random.Random(seed), [], set(exclude)
    while len(items) < n:
        item = _item(rng)
        if state_key(item) not in seen:
            seen.add(state_key(item))
            items.append(item)
    return items


def split(train: int, heldout: int) -> tuple[list[dict], list[dict]]:
    """(training items, held-out items): the held-out states never occur in training."""
    train_items = generate(train, TRAIN_SEED)
    return train_items, generate(heldout, HELDOUT_SEED, exclude={state_key(i) for i in train_items})


def body(item: dict) -> dict:
    """The decide body of an item, without its labels."""
    return {k: v for k, v in item.items() if k != "labels"}


def write_jsonl(items: list[dict], path: Path | str) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def read_jsonl(path: Path | str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
