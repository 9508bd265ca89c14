"""deploy/slurm under a real one-host Slurm (Debian's slurm-wlm and munge): the array, its
throttle and GPU request, and the merge after it, against a real tiny daemon.

Skipped, with the reason, where sbatch is not installed or the test cannot start the daemons
(munged, slurmctld and slurmd run as root, all their files in a temporary directory).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.server.daemons import Daemon

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "deploy" / "slurm"
BIN = Path(sys.executable).parent
WITHIN_S = 180.0
GPUS = 2

missing = [name for name in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(name) is None]
pytestmark = [
    pytest.mark.skipif(bool(missing), reason=f"Slurm is not installed here ({', '.join(missing)} missing; "
                                             "Debian: apt-get install slurm-wlm munge)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the one-host Slurm runs its daemons as root"),
]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    directory = Path(tempfile.mkdtemp(prefix="jv-slurm-"))
    env = {**os.environ, "SLURMCTLD_PORT": str(free_port()), "SLURMD_PORT": str(free_port()),
           "PATH": f"{BIN}:{os.environ['PATH']}", "SLURM_CONF": str(directory / "slurm.conf")}
    started = subprocess.run([str(SLURM / "local-cluster.sh"), "start", str(directory), str(GPUS)],
                             env=env, capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.skip(f"the one-host Slurm did not start: {started.stderr.strip()[-500:]}")
    try:
        yield env
    finally:
        subprocess.run([str(SLURM / "local-cluster.sh"), "stop", str(directory)], env=env, timeout=60)
        shutil.rmtree(directory, ignore_errors=True)


def write_suite(path: Path) -> None:
    questions = {"urgent": {"type": "noul"}, "action": {"type": "choice", "criteria": {"refund": None, "close": None}}}
    lines = [{"state": {"ticket": f"ticket {i % 6}", "text": "parcel late again " * (1 + i % 6)},
              "questions": questions, "labels": {"urgent": i % 2 == 0, "action": "close"}} for i in range(12)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_array_runs_its_shards_two_at_a_time_and_the_merge_equals_one_run(cluster, tiny_model, tmp_path):
    daemon_dir = Path(tempfile.mkdtemp(prefix="jvd-"))
    daemon = Daemon(daemon_dir, tiny_model("qwen3", "pointer"), "--max-batch-size", "1", "--prefix-cache", "0")
    try:
        daemon.wait_ready()
        suite, out = tmp_path / "suite.jsonl", tmp_path / "out"
        write_suite(suite)
        env = {**cluster, "JEVANY_ENDPOINT": daemon.endpoint, "SHARDS_PER_GPU": "2"}
        submitted = subprocess.run([str(SLURM / "submit.sh"), str(suite), str(out), str(GPUS), "--cpus-per-task=1"],
                                   env=env, capture_output=True, text=True, timeout=60)
        assert submitted.returncode == 0, submitted.stderr
        array_id = submitted.stdout.split()[1]
        shown = subprocess.run(["scontrol", "show", "job", array_id], env=env, capture_output=True, text=True).stdout
        assert "ArrayTaskThrottle=2" in shown and "gres:gpu:1" in shown, shown
        deadline = time.monotonic() + WITHIN_S
        while not (out / "report.json").exists():
            assert time.monotonic() < deadline, f"no merge within {WITHIN_S}s: {sorted(os.listdir(out))}"
            time.sleep(0.5)     # polling the scheduler's work, which has no event to wait on here
        single = subprocess.run([str(BIN / "jevany-eval"), str(suite), "--endpoint", daemon.endpoint, "--out",
                                 str(tmp_path / "single.jsonl"), "--report", str(tmp_path / "single.json"),
                                 "--no-progress"], capture_output=True, text=True, timeout=WITHIN_S)
        assert single.returncode == 0, single.stdout + single.stderr
    finally:
        daemon.stop()
        shutil.rmtree(daemon_dir, ignore_errors=True)
    shards = sorted(out.glob("shard-*.jsonl"))
    assert len(shards) == 2 * GPUS
    assert sum(len(p.read_text().splitlines()) for p in shards) == 12          # each item in one shard
    assert (out / "report.json").read_bytes() == (tmp_path / "single.json").read_bytes()
