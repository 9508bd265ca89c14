"""The /v1/models entry and the answer headers in JevAny's shapes (gateway/jevany_view.py), in process."""
from jevany_daemon.gateway.jevany_view import (BATCH_SIZE_HEADER, PADDED_TOKENS_HEADER, answer_headers, model_entry,
                                               wants_additions)

DESCRIBED = {"id": "jev-latest", "readout": "pointer", "dtype": "bfloat16", "source": "runs/x",
             "prefix_cache": {"size": 3, "max_entries": 1024, "hits": 5, "misses": 7, "min_tokens": 16}}


def test_readout_is_choice_or_native_in_jevany_s_meaning():
    assert model_entry(DESCRIBED)["readout"] == "native"
    assert model_entry({**DESCRIBED, "readout": "choice"})["readout"] == "choice"


def test_prefix_cache_size_is_the_capacity_and_the_states_held_are_cached_states():
    cache = model_entry(DESCRIBED)["prefix_cache"]
    assert (cache["size"], cache["cached_states"], cache["hits"], cache["misses"], cache["min_state_tokens"]) == (
        1024, 3, 5, 7, 16)
    assert model_entry({"id": "m"})["prefix_cache"] == {"size": 0, "cached_states": None, "hits": None,
                                                        "misses": None, "min_state_tokens": 0}


def test_the_sdk_s_fields_are_there():
    entry = model_entry(DESCRIBED)
    assert entry["name"] == "jev-latest" and entry["release_date"] == "" and "pointer readout" in entry["description"]
    assert "random weights" in model_entry({**DESCRIBED, "random_weights": True})["description"]
    assert "random weights" not in entry["description"]


def test_additions_are_asked_for_by_a_yes_in_any_case():
    assert [wants_additions(v) for v in ("1", "true", "TRUE", " Yes ", "0", "no", "", None)] == [
        True, True, True, True, False, False, False, False]


def test_the_pass_s_batch_goes_in_headers():
    assert answer_headers({"batch": {"size": 4, "padded_tokens": 96}}) == {BATCH_SIZE_HEADER: "4",
                                                                          PADDED_TOKENS_HEADER: "96"}
    assert answer_headers({}) == {BATCH_SIZE_HEADER: "", PADDED_TOKENS_HEADER: ""}
