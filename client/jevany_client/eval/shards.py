"""Shards of a suite: which items one array task of a cluster's scheduler runs.

An item's shard follows from the affinity key of its state (routing.py), so
every question about one state lands in one shard, on one daemon's cache,
whatever the suite's order. `--shard auto` reads I and N from the
scheduler: Slurm's SLURM_ARRAY_TASK_ID (less SLURM_ARRAY_TASK_MIN) and
SLURM_ARRAY_TASK_COUNT, or a Kubernetes Indexed Job's JOB_COMPLETION_INDEX
with JEVANY_SHARD_COUNT (the Job's completions, which Kubernetes does not
pass on by itself). Each shard writes a results file of its own: an O_APPEND
file shared over NFS is not atomic across hosts, and flock there is not
reliable. `jevany-eval merge` joins them.
"""

import os
from dataclasses import dataclass

from ..routing import affinity_key
from .errors import EvalError
from .suite import Item


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def holds(self, item: Item) -> bool:
        return int(affinity_key(item.body.get("state")), 16) % self.count == self.index

    @property
    def name(self) -> str:
        return f"shard-{self.index}-of-{self.count}"


def parse_shard(text: str | None, env=os.environ) -> Shard | None:
    if text is None:
        return None
    if text == "auto":
        return _from_scheduler(env)
    index, sep, count = text.partition("/")
    if not (sep and index.isdigit() and count.isdigit()):
        raise EvalError(f"--shard is I/N (0 <= I < N) or auto, got {text!r}")
    return _checked(int(index), int(count), "--shard")


def _from_scheduler(env) -> Shard:
    if "SLURM_ARRAY_TASK_ID" in env:
        index = _number(env, "SLURM_ARRAY_TASK_ID") - _number(env, "SLURM_ARRAY_TASK_MIN", 0)
        return _checked(index, _number(env, "SLURM_ARRAY_TASK_COUNT"), "SLURM_ARRAY_TASK_*")
    if "JOB_COMPLETION_INDEX" in env:
        return _checked(_number(env, "JOB_COMPLETION_INDEX"), _number(env, "JEVANY_SHARD_COUNT"),
                        "JOB_COMPLETION_INDEX and JEVANY_SHARD_COUNT")
    raise EvalError("--shard auto needs a Slurm array task (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT) "
                    "or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, JEVANY_SHARD_COUNT)")


def _number(env, name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None and default is not None:
        return default
    if value is None or not value.strip().isdigit():
        raise EvalError(f"--shard auto: {name} must be a number, got {value!r}")
    return int(value)


def _checked(index: int, count: int, where: str) -> Shard:
    if not 0 <= index < count:
        raise EvalError(f"{where}: shard {index} of {count} does not exist (0 <= I < N)")
    return Shard(index, count)
