#!/usr/bin/env bash
# Evaluate a suite over a Slurm cluster's GPUs: an array of shards, then a merge once all succeeded.
#
#   deploy/slurm/submit.sh SUITE.jsonl OUT_DIR GPUS [sbatch options...]
#
# Each array task takes one GPU (--gres=gpu:1), starts a daemon of its own on a private ipc socket
# (jevany-eval --serve) and runs its shard; there are SHARDS_PER_GPU (default 3) times as many shards
# as GPUs, so a slow shard is not the whole run's tail, and "%GPUS" keeps at most GPUS running at
# once. The merge job waits for every task to succeed (--dependency=afterok) and writes
# OUT_DIR/results.jsonl and OUT_DIR/report.json. A task that exits 3 (its daemon stayed unavailable
# past --patience) fails, so the merge does not run: submit again and the shards resume.
#
# Environment: JEVANY_SERVE_ARGS, the daemon's serve arguments (default "--model $JEVANY_MODEL
# --device cuda"); JEVANY_ENDPOINT, a daemon to use instead of starting one per task.
set -euo pipefail
suite=${1:?usage: submit.sh SUITE.jsonl OUT_DIR GPUS [sbatch options...]}
out=${2:?usage: submit.sh SUITE.jsonl OUT_DIR GPUS [sbatch options...]}
gpus=${3:?usage: submit.sh SUITE.jsonl OUT_DIR GPUS [sbatch options...]}
shift 3
here=$(cd "$(dirname "$0")" && pwd)
shards=$(( gpus * ${SHARDS_PER_GPU:-3} ))
mkdir -p "$out"
suite=$(realpath "$suite"); out=$(realpath "$out")
array=$(sbatch --parsable --array="0-$((shards - 1))%${gpus}" --output="$out/shard-%a.log" \
        --export=ALL,JEVANY_SUITE="$suite",JEVANY_OUT="$out" "$@" "$here/eval-array.sbatch")
array=${array%%;*}
merge=$(sbatch --parsable --dependency="afterok:${array}" --output="$out/merge.log" \
        --export=ALL,JEVANY_SUITE="$suite",JEVANY_OUT="$out" "$@" "$here/merge.sbatch")
echo "array ${array} (${shards} shards, ${gpus} at once), merge ${merge%%;*}"
