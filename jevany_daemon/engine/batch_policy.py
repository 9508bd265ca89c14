"""When batching pays: learned from the passes this engine actually ran.

On a GPU a pass of 32 requests costs little more than a pass of one; on a
CPU a long prompt already saturates the cores, so a batch of long requests
is slower than scoring them one by one (see the benchmarks). Rather than
guess per device, the engine measures: real tokens per second of passes that
held one request and of passes that held several, per class of row width.
Where batching measured slower, requests of that width run alone. Every
EXPLORE_EVERY-th decision in a class tries the other choice, so the
estimates follow the load instead of freezing on an early sample.

On an accelerator (explore_alone=False) a pass's fixed cost dominates: a
request taken out of a batch to be timed alone costs a whole pass more, and
the client it answers early comes back out of step with the others, so the
next passes split too (on the simulated accelerator, at every sixteenth
decision in a width class 32 requests went as 1 + 31, then as 30 + 2 and the
like). There the policy never tries "alone" while batching is preferred;
lone passes that happen anyway (an idle daemon, a lone client) still measure
it.
"""
from collections import Counter

EXPLORE_EVERY = 16
SMOOTHING = 0.2      # weight of the newest pass in the running rates


def width_class(width: int) -> int:
    return max(0, width - 1).bit_length()    # powers of two: ..., 33-64, 65-128, ...


class BatchPolicy:
    def __init__(self, adaptive: bool = True, explore_alone: bool = True):
        self.adaptive, self.explore_alone = adaptive, explore_alone
        self.reset()

    def reset(self) -> None:
        """Forget every pass measured so far, in place (passes.py holds the policy it records into)."""
        self.rates: dict[tuple[int, bool], float] = {}   # (width class, batched) → real tokens/s
        self.decisions: Counter = Counter()

    def allows_batching(self, width: int) -> bool:
        if not self.adaptive:
            return True
        k = width_class(width)
        self.decisions[k] += 1
        explore = self.decisions[k] % EXPLORE_EVERY == 0
        alone, batched = self.rates.get((k, False)), self.rates.get((k, True))
        if batched is None:
            return True
        if alone is None:
            return not explore or not self.explore_alone
        prefer = batched >= alone
        if prefer and not self.explore_alone:
            return True
        return prefer != explore

    def record(self, width: int, size: int, real_tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        key = (width_class(width), size > 1)
        rate = real_tokens / seconds
        old = self.rates.get(key)
        self.rates[key] = rate if old is None else (1 - SMOOTHING) * old + SMOOTHING * rate

    def as_dict(self) -> dict:
        return {f"{'batched' if b else 'alone'}@{1 << k}": round(r, 1) for (k, b), r in sorted(self.rates.items())}
