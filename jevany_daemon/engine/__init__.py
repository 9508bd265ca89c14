"""The decision engine: admission → batching → passes → answers, with no sockets.

admission.py     a request validated and encoded; a hand-over admitted in one batched tokenization
prompts.py       request → tokens (native delimiters or choice-token chat prompt)
chat_prompt.py   the chat template rendered once: constant token ids around the user message
piecewise.py     texts tokenized by pieces the tokenizer provably cuts at (lines, words), each remembered
batching.py      which requests share a pass, and who runs it (group commit)
batch_policy.py  when batching pays, learnt from the passes run
thread_policy.py on a CPU, one thread or all for a class of passes, learnt from the passes run
layouts.py       tokens → forward passes (rows, packed, or shared: prefix, then branches from its cache)
prefix_cache.py  prefixes already computed, kept LRU within entry and byte bounds; the head pinned
prefix_reuse.py  passes that continue from the longest kept prefix (one forward; hybrid kept states: two)
cache_rows.py    decoder caches as blocks of rows, every layer in one tensor: kept, joined, a few ops a pass
pass_inputs.py   a pass's inputs as host lists, sent to the device in one copy
masks.py         attention masks in which every query row has a key (CUDA returns NaN where none is)
decoder.py       the backbone as every pass calls it: masks in, final hidden states (and a cache) out
passes.py        one pass in two halves: launch (upload, queue the forward) and collect (wait, check, shape)
stream.py        the device as a pass sees it: one copy in, one sync out; a simulated accelerator
readouts.py      hidden states → probabilities on the device (pointer, lm_token, choice)
native_blend.py  the choice readout pooled with a checkpoint's own readout (choice_native_weight)
shaping.py       probabilities → answers, JevAny's self-check, usage counted per pass
stats.py         one record per pass, and the running totals
date_facts.py    day counts between the dates of a state, added to it before encoding (date_facts)
media_pass.py    a media request's one pass: its files, then its prompt, through the vision tower
faults.py        which failures stay with a request and which end the worker
probe.py         what a pass costs the host (forwards, ops, scalar reads): benchmarks and tests
shape_plan.py    the buckets (rows x width) a pass is padded to, fixed from the settings
fixed_forward.py a bucket's static input buffer and its forward, which a CUDA graph can record
replay.py        which pass runs in which bucket, eagerly, compiled or as a CUDA graph; the plan's warm-up
warmup.py        every path scored once before the worker reports ready
describe.py      what the engine serves and how, in our names and JevAny's (models, /v1/models)
engine.py        the Engine that composes them, handing each the parts it uses
"""
