"""The decision engine: prompts → layouts → readouts, batched by group commit. No sockets.

prompts.py   request → tokens (native delimiters or choice-token chat prompt)
layouts.py   tokens → one forward pass (rows, packed, or shared: prefix, then branches from its cache)
masks.py     attention masks in which every query row has a key (CUDA returns NaN where none is)
readouts.py  hidden states → probabilities (pointer, lm_token, choice)
native_blend.py  the choice readout pooled with a checkpoint's own readout (choice_native_weight)
date_facts.py    day counts between the dates of a state, added to it before encoding (date_facts)
media_pass.py    a media request's one pass: its files, then its prompt, through the vision tower
batching.py  which requests share a pass, and who runs it (group commit)
prefix_cache.py  prefixes already computed, kept LRU within entry and byte bounds; the head pinned
prefix_reuse.py  passes that continue from the longest kept prefix (one pass, or two on hybrid models)
cache_rows.py    decoder caches taken apart into request rows and joined back together
faults.py    which failures stay with a request and which end the worker
warmup.py    every path scored once before the worker reports ready
engine.py    admit → batch → score → answers
"""
