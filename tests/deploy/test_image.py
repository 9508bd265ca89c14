"""deploy/image/build.sh: the container image the Kubernetes manifests run.

The quick tests check the script's options and refusals. The image test builds the CPU image (about
three minutes here), reads its OCI config, and runs it under a real OCI runtime (runc, on the
bundle umoci unpacks): a read-only root, the image's own user, a daemon answering a decide request
from inside the container, and a drain on SIGTERM. It is too slow for `make test`'s budget, so it
runs where JEVANY_TEST_IMAGE=1 (`make image-check`), and says so where it skips.
"""
import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "image" / "build.sh"
BODY = {"state": "the parcel is late", "questions": {"action": {"type": "choice",
                                                                "criteria": {"refund": None, "wait": None}}}}


def test_help_lists_every_option_and_an_unknown_one_is_refused():
    shown = subprocess.run([str(BUILD), "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0
    for option in ("--out DIR", "--flavour NAME", "--wheels DIR", "--base LAYOUT:TAG", "--extras LIST", "--mirror URL"):
        assert option in shown.stdout
    wrong = subprocess.run([str(BUILD), "--colour", "red"], capture_output=True, text=True, timeout=30)
    assert wrong.returncode == 2 and "unknown option --colour" in wrong.stderr


def test_a_missing_tool_is_named_with_its_package_before_anything_is_built(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("dirname", "realpath", "id"):
        (bin_dir / name).symlink_to(shutil.which(name))
    done = subprocess.run(["/bin/bash", str(BUILD), "--out", str(tmp_path / "image")], env={"PATH": str(bin_dir)},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 3
    assert "mmdebstrap umoci not found (Debian: apt-get install mmdebstrap umoci)" in done.stderr
    assert not (tmp_path / "image").exists()


def _config(layout: Path, tag: str) -> dict:
    index = json.loads((layout / "index.json").read_text())
    [manifest] = [m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag]

    def blob(digest: str) -> dict:
        return json.loads((layout / "blobs" / "sha256" / digest.split(":")[1]).read_text())

    return blob(blob(manifest["digest"])["config"]["digest"])["config"]


def _runc(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runc", *args], capture_output=True, text=True, **kw)


@pytest.mark.skipif(os.environ.get("JEVANY_TEST_IMAGE") != "1",
                    reason="builds the image (minutes): set JEVANY_TEST_IMAGE=1 (make image-check)")
@pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in ("mmdebstrap", "umoci", "runc")),
                    reason="needs root, mmdebstrap, umoci and runc (Debian: apt-get install mmdebstrap umoci runc)")
def test_the_cpu_image_runs_as_its_user_answers_a_decision_and_drains_on_sigterm(tmp_path):
    layout = tmp_path / "image"
    built = subprocess.run([str(BUILD), "--out", str(layout)], capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, built.stderr[-2000:]
    tag = next(line.split()[1].rsplit(":", 1)[1] for line in built.stdout.splitlines() if line.startswith("image:"))
    config = _config(layout, tag)
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["/opt/jevany/bin/jevany-daemon"]
    assert "PATH=/opt/jevany/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in config["Env"]
    assert (layout / "digest").read_text().startswith("sha256:")

    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)], check=True, capture_output=True,
                   timeout=600)
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"]["readonly"] = True          # as a pod would run it: only its volumes are written
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["sh", "-c", "jevany-daemon tiny-model /tmp/model && exec jevany-daemon serve "
                               "--model /tmp/model --bind ipc:///run/jevany/d.sock --control ipc:///run/jevany/c.sock"]
    spec["mounts"] += [{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                        "options": ["nosuid", "nodev", "mode=1777"]},
                       {"destination": "/run/jevany", "type": "tmpfs", "source": "tmpfs",
                        "options": ["nosuid", "nodev", "mode=0750", "uid=10001", "gid=10001"]}]
    (bundle / "config.json").write_text(json.dumps(spec))

    name = f"jv-{uuid.uuid4().hex[:8]}"
    log = (tmp_path / "daemon.log").open("w")
    runtime = subprocess.Popen(["runc", "run", "--bundle", str(bundle), name], stdin=subprocess.DEVNULL,
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while _runc("exec", name, "jevany-ctl", "status", "--ready", "-e", "ipc:///run/jevany/c.sock",
                    timeout=60).returncode != 0:
            assert runtime.poll() is None, (tmp_path / "daemon.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the daemon in the container never became ready"
            time.sleep(1)           # polling a process in another namespace, which has no event to wait on
        user = _runc("exec", name, "id", "-u", timeout=60)
        assert user.stdout.strip() == "10001"
        answer = _runc("exec", name, "jevany-client", "decide", "-e", "ipc:///run/jevany/d.sock", "-",
                       input=json.dumps(BODY), timeout=120)
        assert answer.returncode == 0, answer.stderr
        assert json.loads(answer.stdout)["answers"]["action"]["choice"] in ("refund", "wait")
        assert _runc("kill", name, "TERM", timeout=60).returncode == 0
        assert runtime.wait(120) == 0
    finally:
        if runtime.poll() is None:
            _runc("kill", name, "KILL", timeout=60)
            runtime.wait(60)
        _runc("delete", "--force", name, timeout=60)
        log.close()
    logged = (tmp_path / "daemon.log").read_text()
    assert "event=drain cause=SIGTERM" in logged and "event=stop exit_code=0" in logged


def test_every_manifest_runs_the_image_by_its_documented_variable():
    for manifest in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        images = [line.split("image:", 1)[1].split("#")[0].strip() for line in manifest.read_text().splitlines()
                  if line.strip().startswith("image:")]
        assert all(image == "${JEVANY_IMAGE}" for image in images), (manifest.name, images)
    assert "export JEVANY_IMAGE=" in (ROOT / "docs" / "ACROSS-HOSTS.md").read_text()
