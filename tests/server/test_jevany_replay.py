"""JevAny's own server cases (tests/server/jevany_replay.py) against our gateway's routes: every one matches,
or is a departure docs/COMING-FROM-JEVANY.md lists with its reason.

The pointer checkpoint is served by a real daemon (`serve --http`, a media root holding an image); the
choice readout by the same routes on a model in this process (jevany_daemon.asgi.create_app(model=...)),
and lm_token by `jevany_daemon.asgi:app` as uvicorn loads it, from the JEVANY_* settings. Those two have
no media root, so the two media cases run on the daemon alone (the script runs all three as daemons).
"""
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from jevany_daemon import asgi
from jevany_daemon.config import EngineConfig
from jevany_daemon.engine.engine import Engine

from ..docs import DOCS, section
from .asgi_thread import serving
from .daemons import Daemon, wait_for
from .http_proc import free_port
from .jevany_replay import CASES, DEPARTURES, Server, _healthy, replay

JEVANY_PAGE = DOCS / "COMING-FROM-JEVANY.md"


@pytest.fixture(scope="module")
def servers(tiny_model, loaded_model, tmp_path_factory):
    media = tmp_path_factory.mktemp("replay-media")
    Image.new("RGB", (28, 28), "red").save(media / "image.png")
    port = free_port()
    daemon = Daemon(Path(tempfile.mkdtemp(prefix="jvr-")), tiny_model("qwen3", "pointer"),
                    "--http", f"127.0.0.1:{port}", "--media-root", str(media))
    env = pytest.MonkeyPatch()
    try:
        env.setenv("JEVANY_MODEL", str(tiny_model("qwen3", "lm_token")))
        env.setenv("JEVANY_DEVICE", "cpu")
        choice = asgi.create_app(model=asgi.JevModel(Engine(loaded_model("qwen3", "choice"), EngineConfig())))
        with serving(choice) as choice_port, serving("jevany_daemon.asgi:app") as lm_port:
            daemon.wait_ready()
            pointer = Server("pointer", port, tiny_model("qwen3", "pointer"), "image.png")
            wait_for(lambda: _healthy(pointer), 60, "the daemon's gateway")
            yield {"pointer": pointer, "choice": Server("choice", choice_port, tiny_model("qwen3", "choice"), None),
                   "lm_token": Server("lm_token", lm_port, tiny_model("qwen3", "lm_token"), None)}
    finally:
        env.undo()
        vars(asgi).pop("app", None)          # built from this test's environment
        daemon.stop()
        shutil.rmtree(daemon.dir, ignore_errors=True)


def test_every_jevany_case_matches_or_is_a_listed_departure(servers):
    outcomes = replay(servers)
    assert len(outcomes) == len(CASES) - 2 and len(CASES) >= 130      # the two media cases: the daemon's alone
    unexpected = {c.name: why for c, why in outcomes if why is not None and c.name not in DEPARTURES}
    assert unexpected == {}
    # a departure that now matches is no longer one: the list and the page must say so
    assert {c.name for c, why in outcomes if why is not None} == set(DEPARTURES)


def test_coming_from_jevany_lists_each_departure_with_its_reason():
    """The "Coming from JevAny" page (the README's section until it became a page) gives each reason."""
    listed = section(JEVANY_PAGE, "Coming from JevAny")
    assert "Where we differ from JevAny, and why" in listed
    for reason in DEPARTURES.values():
        assert re.search(re.escape(reason), listed, re.IGNORECASE), reason
