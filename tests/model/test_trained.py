"""The starter model: its suite, its training, and what it scores once served."""
import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from jevany_client.schema import parse_decision
from jevany_daemon.inprocess import JevModel
from jevany_daemon.model.checkpoint import read_meta
from jevany_daemon.model.loading import load_model
from jevany_daemon.starter import evaluate, suite
from jevany_daemon.starter.build import HELDOUT_FILE, TRAINING_FILE, build_trained_model, splits
from jevany_daemon.starter.train import Recipe

# Enough to train a (useless) model end to end in seconds: for determinism, not accuracy.
SMALL = Recipe(train_items=40, calibration_items=10, heldout_items=10, batch_items=20, head_steps=4, tune_items=20)


def test_suite_is_deterministic_and_its_splits_share_no_state():
    train, calibration, heldout = splits(Recipe())
    assert (train, calibration, heldout) == splits(Recipe())
    keys = [{suite.state_key(i) for i in part} for part in (train, calibration, heldout)]
    assert sum(map(len, keys)) == len(train) + len(calibration) + len(heldout)    # distinct within each split
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])


def test_items_are_decide_bodies_whose_labels_follow_from_their_states():
    items = suite.generate(300, seed=5)
    kinds = set()
    for item in items:
        request = parse_decision(suite.body(item))     # exactly what a client may send
        assert set(item["labels"]) == {q.qid for q in request.questions}
        expected = suite.expected(item["state"])       # read back from the ticket's words
        assert item["labels"] == {qid: expected[qid] for qid in item["labels"]}
        kinds |= {q.type for q in request.questions}
    assert kinds == {"choice", "noul", "score"}
    # every answer of every question occurs, so no constant answer scores well
    for qid, question in suite.QUESTIONS.items():
        seen = {json.dumps(i["labels"][qid]) for i in items if qid in i["labels"]}
        options = {"choice": list(question.get("criteria") or ()), "noul": [False, True],
                   "score": list(range(len(question.get("criteria") or ())))}[question["type"]]
        assert seen == {json.dumps(o) for o in options}, qid


def test_a_label_changes_with_the_words_that_decide_it():
    state = {"customer": "Ana", "plan": "pro", "ticket": "My parcel never arrived. I need this fixed today."}
    assert suite.expected(state) == {"team": "shipping", "urgency": 2, "refund": False, "priority": "today"}
    outage = dict(state, ticket="The invoice shows the wrong amount. This is a full outage for the whole company.")
    assert suite.expected(outage) == {"team": "billing", "urgency": 3, "refund": False, "priority": "now"}
    assert suite.expected(dict(state, plan="enterprise"))["priority"] == "now"
    with pytest.raises(ValueError, match="ambiguous"):
        suite.expected(dict(state, ticket="My parcel never arrived. My account was locked."))


def test_heldout_accuracy_through_the_serving_path(trained_model):
    """The acceptance bar: >= 90% of held-out questions right, scored by the engine as a daemon would."""
    items = suite.read_jsonl(trained_model / HELDOUT_FILE)
    assert len(items) == Recipe().heldout_items
    engine = JevModel.load(str(trained_model), max_batch_size=8, batch_policy="greedy").engine
    results = engine.score([engine.admit(suite.body(item)) for item in items])
    figures = evaluate.report(items, results)
    assert figures["overall"]["accuracy"] >= 0.9, evaluate.format_report(figures)
    assert all(figures[kind]["accuracy"] >= 0.8 for kind in ("choice", "noul", "score")), figures
    assert 0 <= figures["overall"]["ece"] <= 0.1, figures
    # the figures the build printed and kept are this measurement, not the training loop's
    kept = json.loads((trained_model / TRAINING_FILE).read_text())["heldout"]
    assert kept["overall"]["accuracy"] == pytest.approx(figures["overall"]["accuracy"], abs=1 / 600)


def test_run_directory_loads_through_the_daemon_loader(trained_model):
    meta = read_meta(trained_model)
    assert (meta.decision_mode, meta.base, meta.lora, meta.tokenizer_saved) == ("pointer", "base", 8, True)
    assert meta.temperature != 1.0                    # fitted on the calibration items
    model = load_model(str(trained_model))
    assert model.readout == "pointer" and model.head is not None
    assert model.info["kind"] == "jevany-checkpoint" and model.info["lora"] == 8
    adapter = load_file(trained_model / "adapter_model.safetensors")
    assert any(name.endswith("lora_B.weight") and tensor.abs().max() > 0 for name, tensor in adapter.items())


def test_training_is_deterministic(tmp_path):
    first = build_trained_model(tmp_path / "a", SMALL)
    second = build_trained_model(tmp_path / "b", SMALL)
    assert first["temperature"] == second["temperature"] and first["head_loss"] == second["head_loss"]
    heads = [torch.load(tmp_path / d / "head.pt", weights_only=True)["head"] for d in "ab"]
    assert heads[0].keys() == heads[1].keys() and all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])
    adapters = [load_file(tmp_path / d / "adapter_model.safetensors") for d in "ab"]
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])
    other = build_trained_model(tmp_path / "c", replace(SMALL, seed=1))
    assert other["head_loss"] != first["head_loss"]


def test_a_build_refuses_a_non_empty_directory_and_leaves_nothing_behind(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_trained_model(tmp_path, SMALL)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_measure_counts_an_error_as_no_answer():
    items = suite.generate(2, seed=9)
    answer = {"type": "choice", "choice": "billing", "confidence": 1.0,
              "probabilities": {"billing": 1.0, "shipping": 0.0, "accounts": 0.0, "technical": 0.0}}
    item = dict(items[0], labels={"team": "billing"})
    figures = evaluate.report([item, items[1]], [{"answers": {"team": answer}}, None])
    assert figures["errors"] == 1 and figures["overall"] == {"questions": 1, "accuracy": 1.0, "ece": 0.0}


def test_expected_calibration_error_by_hand():
    # bin [0.6, 0.667): confidences 0.6, 0.6, one right: |0.5 - 0.6| x 2/4; bin [0.933, 1]: 1.0, 1.0 both right: 0
    pairs = [(0.6, True), (0.6, False), (1.0, True), (1.0, True)]
    assert evaluate.expected_calibration_error(pairs) == pytest.approx(0.05)
    # 15 bins exactly: 0.61 and 0.66 share [0.6, 0.667): |0.5 - 0.635|; 0.52 and 0.58 do not: (0.48 + 0.58) / 2
    assert evaluate.expected_calibration_error([(0.61, True), (0.66, False)]) == pytest.approx(0.135)
    assert evaluate.expected_calibration_error([(0.52, True), (0.58, False)]) == pytest.approx(0.53)
