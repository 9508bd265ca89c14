"""What a JevAny client reads over HTTP: the /v1/models entry and the answer body, in JevAny's shapes.

The models op already describes the model with JevAny's fields, under its
names, wherever they do not clash with ours. Two names clash, and on HTTP
JevAny's meaning wins: `readout` is native (a checkpoint's own head) or choice,
and `prefix_cache.size` is the configured capacity (ours counts the states
held, which JevAny calls cached_states). Our other fields stay: JevAny's
clients read what they know and pass over the rest.

An answer body is JevAny's exactly (dialects.py): model, answers (JevAny's
keys, in its order), usage, latency_ms. JevAny's own tests compare answers for
equality, so our additions (noul's probabilities, the pass's batch) leave the
body: the batch goes in headers, and a caller who wants the protocol's result
whole asks with `X-Jevany-Daemon-Additions: 1`.
"""
ADDITIONS_HEADER = "X-Jevany-Daemon-Additions"
BATCH_SIZE_HEADER = "X-Jevany-Daemon-Batch-Size"
PADDED_TOKENS_HEADER = "X-Jevany-Daemon-Padded-Tokens"


def model_entry(description: dict) -> dict:
    """A models-op description as JevAny's /v1/models entry, with the fields the Jev API's clients read
    (name, description, release_date: typesafe-sdk's model list)."""
    entry = dict(description)
    entry["name"] = description.get("id", "")
    entry["description"] = _described(description)
    entry["release_date"] = description.get("release_date") or ""
    entry["readout"] = "choice" if description.get("readout") == "choice" else "native"
    ours = description.get("prefix_cache") or {}
    # JevAny's keys, always; its counters null where the daemon keeps them off the public endpoints
    # (--public-cache-counters shows them: one tenant only).
    entry["prefix_cache"] = {**ours, "size": ours.get("max_entries", 0), "cached_states": ours.get("size"),
                             "hits": ours.get("hits"), "misses": ours.get("misses"),
                             "min_state_tokens": ours.get("min_tokens", 0)}
    return entry


def _described(d: dict) -> str:
    what = "a decision model" + (" with random weights (the demo)" if d.get("random_weights") else "")
    return f"{what}: {d.get('readout')} readout, {d.get('dtype')}, served by jevany-daemon from {d.get('source')}"


def models_body(models: dict) -> dict:
    return {**models, "models": [model_entry(d) for d in models.get("models", [])]}


def answer_headers(result: dict) -> dict:
    batch = result.get("batch") or {}
    return {BATCH_SIZE_HEADER: str(batch.get("size", "")), PADDED_TOKENS_HEADER: str(batch.get("padded_tokens", ""))}


def wants_additions(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")
