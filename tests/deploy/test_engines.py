"""scripts/test-engines: what `make test` runs first so that the Slurm and HAProxy tests run, not skip.

Here it runs with a PATH of its own making (stand-ins for the engines' commands, no apt-get), so
nothing is installed; the install itself is what CI's run of `make test` does on a fresh machine.
"""
import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test-engines"
ENGINES = ("haproxy", "sbatch", "slurmctld", "slurmd", "munged")


def _run(tmp_path: Path, present: tuple[str, ...], **env) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in present:
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "id").symlink_to("/usr/bin/id")        # and no apt-get: nothing can be installed
    return subprocess.run(["/bin/bash", str(SCRIPT)], env={"PATH": str(bin_dir), **env}, capture_output=True,
                          text=True, timeout=30)


def test_with_every_engine_there_it_says_and_does_nothing(tmp_path):
    done = _run(tmp_path, ENGINES)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_a_missing_engine_it_cannot_install_is_one_line_and_never_a_failed_run(tmp_path):
    done = _run(tmp_path, ("sbatch", "slurmctld", "slurmd"))
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines() == [
        "test engines: haproxy munge not installed, and only root with apt-get installs them here: their tests skip"]


def test_one_missing_slurm_command_asks_for_the_slurm_package(tmp_path):
    done = _run(tmp_path, ("haproxy", "sbatch", "slurmd", "munged"))
    assert done.returncode == 0 and "test engines: slurm-wlm not installed" in done.stdout


def test_skip_leaves_the_machine_alone_and_quiet(tmp_path):
    done = _run(tmp_path, (), JEVANY_TEST_ENGINES="skip")
    assert (done.returncode, done.stdout) == (0, "")
    assert os.access(SCRIPT, os.X_OK), "make test runs it as a command"
