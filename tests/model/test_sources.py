"""A hub id that cannot be loaded here is refused in seconds, in one line that says what to type instead."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from jevany_daemon.model import sources
from jevany_daemon.model.sources import hub_problem


@pytest.fixture
def closed_port():
    """A loopback port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def listening():
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def cached(tmp_path, repo="owner/name", snapshot="0123abc", ref="main"):
    root = tmp_path / "hub" / ("models--" + repo.replace("/", "--"))
    (root / "snapshots" / snapshot).mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / ref).write_text(snapshot)
    return {"HF_HUB_CACHE": str(tmp_path / "hub")}


def test_offline_and_not_cached_names_the_path_to_type_instead(tmp_path):
    problem = hub_problem("runs/nope", env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)})
    assert "runs/nope is neither a directory here" in problem and "HF_HUB_OFFLINE is set" in problem
    assert "./runs/nope" in problem and "\n" not in problem


def test_an_unreachable_hub_is_said_with_where_it_was_tried(tmp_path, closed_port):
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port}", "HF_HUB_CACHE": str(tmp_path)}
    problem = hub_problem("runs/nope", env=env)
    assert f"127.0.0.1:{closed_port} took no connection" in problem and "./runs/nope" in problem


def test_a_hub_that_takes_a_connection_lets_the_loader_try(tmp_path, listening, closed_port):
    assert hub_problem("owner/name", env={"HF_ENDPOINT": listening, "HF_HUB_CACHE": str(tmp_path)}) is None
    # A proxy is where a download connects first: it is what must answer.
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port}", "HTTPS_PROXY": listening, "HF_HUB_CACHE": str(tmp_path)}
    assert hub_problem("owner/name", env=env) is None


def test_a_cached_snapshot_is_loadable_offline_and_a_revision_must_be_the_cached_one(tmp_path):
    env = {**cached(tmp_path), "HF_HUB_OFFLINE": "1"}
    assert hub_problem("owner/name", env=env) is None
    assert hub_problem("owner/name@main", env=env) is None              # a ref that points at the snapshot
    assert hub_problem("owner/name@0123abc", env=env) is None           # the commit itself
    assert hub_problem("owner/name@v2", env=env) is not None            # not cached
    assert hub_problem("owner/other", env=env) is not None


def test_hf_home_s_cache_is_its_hub_folder_not_hf_home_itself(tmp_path):
    # As huggingface_hub reads them: no HF_HUB_CACHE, so the cache is $HF_HOME/hub.
    home = tmp_path / "hf-home"
    cached(home)                                                          # $HF_HOME/hub/models--owner--name
    (home / "models--owner--flat" / "snapshots" / "0123abc").mkdir(parents=True)   # beside hub/, not in it
    env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    assert hub_problem("owner/name", env=env) is None
    problem = hub_problem("owner/flat", env=env)
    assert "model owner/flat is neither" in problem and "nor in the Hugging Face cache" in problem


def test_a_lookup_that_hangs_is_given_up_on_in_time(monkeypatch):
    never = threading.Event()

    def hangs(*args, **kwargs):
        never.wait()
        raise OSError("the lookup ended after all")

    monkeypatch.setattr(sources.socket, "create_connection", hangs)
    began = time.monotonic()
    assert sources._reachable("hub.invalid", 443, 0.2) is False
    assert time.monotonic() - began < 2.0      # bounded by its wait, not by a lookup's own timeout
    never.set()


def test_serve_refuses_a_mistyped_path_in_one_line_and_exit_2(tmp_path, closed_port):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_ENDPOINT": f"http://127.0.0.1:{closed_port}",
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}     # no HF_HUB_OFFLINE: a user's shell
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "jevany_daemon", "serve", "--model", "runs/nope"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and time.monotonic() - began < 60      # the hub's retries took 77 s
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: --model: model runs/nope is neither a directory here") and "./runs/nope" in line
