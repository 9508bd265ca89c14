"""The decision engine: prompts → layouts → readouts, batched by group commit. No sockets.

prompts.py   request → tokens (native delimiters or choice-token chat prompt)
layouts.py   tokens → one forward pass (rows or packed)
readouts.py  hidden states → probabilities (pointer, lm_token, choice)
batching.py  which requests share a pass, and who runs it (group commit)
engine.py    admit → batch → score → answers
"""
