"""How many threads a CPU pass runs on: learned from the passes this engine ran, as batching is.

On a CPU torch splits each operation of a pass over its threads, in
OpenMP regions: a region wakes the other threads and waits for the last of
them. Workers wait passively (server/worker_handle.py, THREAD_DEFAULTS), so
every region pays a wake-up of each other thread, whose cost is the host's,
not ours. On a virtual machine an idle vCPU is halted and waking it goes
through the hypervisor: on the 2-vCPU machine the benchmarks ran on, about
100 µs a region, where a short pass of the starter model has about 40
regions and one of 32 requests about 300 (benchmarks/thread_probe.py). There
every pass of the starter model ran faster on one thread than on two. On a
busy host a wake-up waits until the hypervisor runs the vCPU again (steal),
and a pass's regions multiply that wait.

So, per class of pass (its real tokens, by powers of two), the engine
measures real tokens per second on all of its threads (the most it was
given: --cpu-threads), then on one, and runs the class on the faster. Every
EXPLORE_EVERY-th pass of a class runs on the other count, so the choice
follows the host as it changes: a slow host moves a class to one thread,
and the class comes back once all the threads measure faster again. A pass
on one thread wakes no other thread at all.

Off a CPU the threads only form inputs, and under --batch-invariant the
warm-up checks the bits at the worker's count, which no pass may change, so
there the count stays fixed (adaptive=False).
"""
from collections import Counter
from contextlib import contextmanager

import torch

EXPLORE_EVERY = 32
SMOOTHING = 0.2      # weight of the newest pass in the running rates


def token_class(tokens: int) -> int:
    return max(0, tokens - 1).bit_length()    # powers of two: ..., 33-64, 65-128, ...


class ThreadPolicy:
    def __init__(self, most: int | None = None, adaptive: bool = True):
        self.most = max(1, torch.get_num_threads() if most is None else most)    # the process's, by default
        self.adaptive = adaptive and self.most > 1
        self.reset()

    def reset(self) -> None:
        """Forget every pass measured so far, in place (passes.py holds the policy it records into)."""
        self.rates: dict[tuple[int, int], float] = {}    # (token class, threads) → real tokens/s
        self.decisions: Counter = Counter()
        self.passes: Counter = Counter()                  # threads → passes run on that many

    def choose(self, tokens: int) -> int:
        """The threads a pass of this many real tokens runs on."""
        if not self.adaptive:
            return self.most
        k = token_class(tokens)
        self.decisions[k] += 1
        explore = self.decisions[k] % EXPLORE_EVERY == 0
        one, most = self.rates.get((k, 1)), self.rates.get((k, self.most))
        if most is None:
            return self.most
        if one is None:
            return 1            # measured on all threads only: one thread next, to compare
        prefer = 1 if one > most else self.most
        return (self.most + 1 - prefer) if explore else prefer

    def record(self, tokens: int, threads: int, seconds: float) -> None:
        self.passes[threads] += 1
        if seconds <= 0 or not self.adaptive:
            return
        key = (token_class(tokens), threads)
        rate = tokens / seconds
        old = self.rates.get(key)
        self.rates[key] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate

    @contextmanager
    def running(self, threads: int):
        """torch's threads set to `threads` for what runs inside, and set back after (torch's count is the
        process's: a model in a caller's process leaves the caller's count as it was). Fixed: left alone."""
        before = torch.get_num_threads()
        if not self.adaptive or threads == before:
            yield
            return
        torch.set_num_threads(threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def as_dict(self) -> dict:
        return {"most": self.most, "adaptive": self.adaptive,
                "passes": {str(k): v for k, v in sorted(self.passes.items())},
                "measured_tokens_per_s": {f"{t}@{1 << k}": round(r, 1) for (k, t), r in sorted(self.rates.items())}}
