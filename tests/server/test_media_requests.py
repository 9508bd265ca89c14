"""Media requests through a real daemon: checked by the media checker process, never on the loop."""
import json
import os
import signal
import time
from pathlib import Path

import pytest

from jevany_client import InvalidRequestError, UnsupportedMediaError
from jevany_client.errors import DeadlineExceededError

from .daemons import wait_for

Image = pytest.importorskip("PIL.Image")

TEXT = {"state": {"ticket": "parcel lost"}, "questions": {"u": {"type": "noul"}}}


def with_media(*items):
    return {**TEXT, "media": [{"type": kind, "uri": uri} for kind, uri in items]}


def _cat(path) -> None:
    """A picture with some structure (a blank one reads the same as no picture at all)."""
    picture = Image.new("RGB", (48, 32))
    picture.putdata([(x * 5, y * 7, (x + y) * 3) for y in range(32) for x in range(48)])
    picture.save(path)


def decide_error(client, body, **kw):
    with pytest.raises((InvalidRequestError, UnsupportedMediaError, DeadlineExceededError)) as info:
        client.call("decide", body, **kw)
    return info.value


def test_media_is_refused_plainly_without_a_root(start_daemon, tmp_path):
    from jevany_daemon.model.tiny import build_tiny_model

    # a checkpoint that reads text only: the model is named, and no root would help
    daemon = start_daemon(readout="pointer")
    with daemon.client(timeout=30, retries=0) as client:
        err = decide_error(client, with_media(("image", "a.png")))
        model = client.models()["models"][0]["id"]
        assert (err.code, err.message) == ("invalid_request", f"model {model} takes no media; send the request "
                                           "without them")
        assert client.status()["media"]["enabled"] is False
    assert daemon.stop() == 0
    # one that reads images: the operator's two ways to set a root
    daemon = start_daemon(model=build_tiny_model(tmp_path / "mm", arch="qwen3_5", readout="pointer",
                                                 multimodal=True))
    with daemon.client(timeout=30, retries=0) as client:
        err = decide_error(client, with_media(("image", "a.png")))
        described = client.models()["models"][0]
        assert described["media_types"]
        assert (err.code, err.message) == ("invalid_request", f"media is disabled: model {described['id']} takes "
                                           f"{', '.join(described['media_types'])}, and the server operator has "
                                           "set no media root (--media-root, or JEVANY_MEDIA_ROOT)")
    assert daemon.stop() == 0
    # a plain causal LM is loaded for text alone without a root, so what it could take is not known
    daemon = start_daemon(readout="choice")
    with daemon.client(timeout=30, retries=0) as client:
        err = decide_error(client, with_media(("image", "a.png")))
        model = client.models()["models"][0]["id"]
        assert (err.code, err.message) == ("invalid_request", f"media is disabled: model {model} is served for "
                                           "text only, and the server operator has set no media root "
                                           "(--media-root, or JEVANY_MEDIA_ROOT)")
    assert daemon.stop() == 0


def test_checked_media_reaches_the_model_and_refusals_keep_their_messages(start_daemon, tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    Image.new("RGB", (32, 24)).save(root / "a.png")
    Image.new("1", (5000, 5000)).save(root / "bomb.png")
    daemon = start_daemon("--media-root", str(root), readout="choice")
    with daemon.client(timeout=30, retries=0) as client:
        # the policy's refusals, in the checker process
        assert decide_error(client, with_media(("image", "nope.png"))).message == "media file does not exist"
        assert decide_error(client, with_media(("image", "bomb.png"))).message == f"image exceeds {4096 * 4096} pixels"
        assert decide_error(client, with_media(("image", "../x.png"))).code == "invalid_request"
        # a good file passes the policy and meets the model: this one reads text only
        err = decide_error(client, with_media(("image", "a.png")))
        assert (err.code, err.message) == ("unsupported_media", "choice readout does not support media requests")
        assert client.call("decide", TEXT)["answers"]["u"]["type"] == "noul"
        models = client.models()["models"][0]
        assert models["limits"]["media_enabled"] is False and models["limits"]["media_max_pixels"] == 4096 * 4096
        assert client.status()["media"]["checking"] == 0
    assert daemon.stop() == 0


def test_a_stuck_check_costs_one_request_and_text_keeps_flowing(start_daemon, tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    Image.new("RGB", (32, 24)).save(root / "a.png")
    daemon = start_daemon("--media-root", str(root), "--media-check-timeout", "2", readout="choice")
    checker = daemon.status()["media"]["checker_pid"]
    os.kill(checker, signal.SIGSTOP)       # a check that never ends, like a decoder stuck on a hostile file
    try:
        with daemon.client(timeout=60, retries=0) as media_client, daemon.client(timeout=60) as text:
            started = time.monotonic()
            # the text request is answered while the media check is stuck
            import threading

            outcome = {}
            waiter = threading.Thread(target=lambda: outcome.update(
                err=decide_error(media_client, with_media(("image", "a.png")))))
            waiter.start()
            wait_for(lambda: text.status()["media"]["checking"] == 1, 30, "the media request at the checker")
            assert text.call("decide", TEXT)["answers"]["u"]["type"] == "noul"
            text_done = time.monotonic() - started
            waiter.join(60)
            assert outcome["err"].message == "media file could not be validated"
            assert text_done < 2.0 <= time.monotonic() - started
            status = text.status()
            assert status["media"]["checker_restarts"] == 1 and status["media"]["checker_pid"] != checker
            # the new checker serves the next request
            err = decide_error(text, with_media(("image", "a.png")))
            assert err.code == "unsupported_media"
    finally:
        try:
            os.kill(checker, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert daemon.stop() == 0


def test_a_media_request_amid_text_load_runs_alone_and_answers_as_in_process(start_daemon, tmp_path):
    import multiprocessing as mp

    from jevany_daemon import workloads
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine
    from jevany_daemon.model.loading import load_model
    from jevany_daemon.model.tiny import build_tiny_model
    from jevany_daemon.parity import compare

    from .client_proc import stream

    model_dir = build_tiny_model(tmp_path / "mm", arch="qwen3_5", readout="pointer", multimodal=True)
    root = tmp_path / "media"
    root.mkdir()
    _cat(root / "cat.png")
    daemon = start_daemon("--media-root", str(root), "--max-batch-size", "8", "--batch-policy", "greedy",
                          model=model_dir)
    media_body = {"state": {"ticket": "what is this?"}, "media": [{"type": "image", "uri": "cat.png"}],
                  "questions": {"q": {"type": "choice", "criteria": {"cat": None, "dog": None, "bird": None}}}}
    bodies = workloads.short(48, seed=4)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    together = ctx.Barrier(7)
    procs = [ctx.Process(target=stream, args=(daemon.endpoint, bodies[k::6], k * 100, queue, together))
             for k in range(6)]
    for p in procs:
        p.start()
    with daemon.client(timeout=120) as client:
        together.wait(120)
        media_result = client.decide(media_body["state"], media_body["questions"], media=media_body["media"])
    got = {}
    for _ in procs:
        for index, _, result in queue.get(timeout=240):
            got[index] = result
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    engine = Engine(load_model(str(model_dir), media=True), EngineConfig())
    order = [(k * 100 + i, body) for k in range(6) for i, body in enumerate(bodies[k::6])]
    report = compare([engine.decide(body) for _, body in order], [got[i] for i, _ in order])
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == []
    expected = engine.decide({**media_body, "media": [{"type": "image", "uri": str(root / "cat.png")}]})
    assert compare([expected], [media_result])["max_abs_diff"] <= 1e-5
    assert media_result["batch"]["size"] == 1                           # alone
    histogram = daemon.status()["batching"]["batch_size_histogram"]
    assert max(int(size) for size in histogram) > 1                      # text batched around it
    assert daemon.stop() == 0


def test_a_video_request_is_checked_decoded_and_answered_as_in_process(start_daemon, tmp_path):
    # The video is generated here; the checker validates it with PyAV, the worker decodes and
    # preprocesses it (on torch alone where torchvision is missing), and the answer is the
    # in-process engine's on the same file.
    from jevany_client import Video
    from jevany_daemon.config import EngineConfig
    from jevany_daemon.engine.engine import Engine
    from jevany_daemon.model.loading import load_model
    from jevany_daemon.model.tiny import build_tiny_model
    from jevany_daemon.parity import compare
    from tests.media.clips import gradients, write_clip

    model_dir = build_tiny_model(tmp_path / "mm", arch="qwen3_5", readout="pointer", multimodal=True)
    root = tmp_path / "media"
    root.mkdir()
    write_clip(root / "clip.mp4", gradients(9, 48, 64), fps=4)
    write_clip(root / "twin.mp4", gradients(9, 48, 64, seed=1), fps=4)     # only its pixels differ
    write_clip(root / "still.mp4", gradients(1, 48, 64), fps=4)            # one frame, repeated
    daemon = start_daemon("--media-root", str(root), model=model_dir)
    state = {"ticket": "what happens in the clip?"}
    questions = {"q": {"type": "choice", "criteria": {"cat": None, "dog": None, "bird": None}}}
    with daemon.client(timeout=120, retries=0) as client:
        assert client.models()["models"][0]["limits"]["media_enabled"] is True
        served = {name: client.decide(state, questions, media=[Video(name)]) for name in ("clip.mp4", "twin.mp4", "still.mp4")}
        assert client.call("decide", TEXT)["answers"]["u"]["type"] == "noul"
    assert daemon.stop() == 0
    engine = Engine(load_model(str(model_dir), media=True), EngineConfig())
    for name, result in served.items():
        expected = engine.decide({"state": state, "questions": questions,
                                  "media": [{"type": "video", "uri": str(root / name)}]})
        assert compare([expected], [result])["max_abs_diff"] <= 1e-5, name
        assert result["batch"]["size"] == 1
    assert served["clip.mp4"]["answers"]["q"]["probabilities"] != served["twin.mp4"]["answers"]["q"]["probabilities"]


def test_a_dead_checker_and_a_full_queue_never_lose_a_media_request(start_daemon, tmp_path):
    import msgpack
    import zmq

    from jevany_client import OverloadedError

    root = tmp_path / "media"
    root.mkdir()
    Image.new("RGB", (32, 24)).save(root / "a.png")
    daemon = start_daemon("--media-root", str(root), "--max-queue", "2", readout="choice")
    with daemon.client(timeout=60, retries=0) as client:
        # killed while idle: the next media request waits for its successor, and is answered
        os.kill(daemon.status()["media"]["checker_pid"], signal.SIGKILL)
        assert decide_error(client, with_media(("image", "a.png"))).code == "unsupported_media"
        assert client.status()["media"]["checker_restarts"] == 1
        # requests waiting for the checker count against --max-queue
        checker = client.status()["media"]["checker_pid"]
        os.kill(checker, signal.SIGSTOP)
        ctx = zmq.Context()
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(daemon.endpoint)
        try:
            for i in range(2):
                raw.send(msgpack.packb({"v": 1, "id": i, "op": "decide", "body": with_media(("image", "a.png"))}))
            wait_for(lambda: client.status()["media"]["checking"] == 2, 30, "two media requests held")
            with pytest.raises(OverloadedError):
                client.call("decide", TEXT)
        finally:
            os.kill(checker, signal.SIGCONT)
        replies = [msgpack.unpackb(raw.recv()) for _ in range(2) if raw.poll(60_000)]
        raw.close()
        ctx.term()
    assert sorted(r["id"] for r in replies) == [0, 1]                  # both answered once the checker runs
    assert {r["error"]["code"] for r in replies} == {"unsupported_media"}
    assert daemon.stop() == 0


def test_a_file_swapped_after_its_check_is_refused(start_daemon, tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    Image.new("RGB", (32, 24)).save(root / "a.png")
    daemon = start_daemon("--media-root", str(root), "--heartbeat-timeout", "60", readout="choice")
    worker = daemon.workers()[0]["pid"]
    os.kill(worker, signal.SIGSTOP)       # checked and handed over, but not yet read
    try:
        with daemon.client(timeout=60, retries=0) as client:
            import threading

            outcome = {}
            asking = threading.Thread(target=lambda: outcome.update(
                err=decide_error(client, with_media(("image", "a.png")))))
            asking.start()
            with daemon.client(timeout=30) as watcher:
                wait_for(lambda: watcher.status()["workers"][0]["inflight"] == 1, 30, "the request at the worker")
            Image.new("1", (5000, 5000)).save(root / "a.png")       # now a bomb the caps would refuse
            os.kill(worker, signal.SIGCONT)
            asking.join(60)
    finally:
        try:
            os.kill(worker, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert outcome["err"].message == "media file changed after it was checked; send the request again"
    assert daemon.stop() == 0


def test_images_sent_as_the_jev_api_s_assets_are_checked_and_answered_as_by_path(start_daemon, tmp_path):
    # typesafe-sdk's Image: a multipart body. The gateway keeps each image in the daemon's uploads
    # directory while its request runs; the answer is the one the same file by path gets.
    from typesafe_sdk import Choice, TypeSafeClient
    from typesafe_sdk import Image as SdkImage

    from jevany_daemon.model.tiny import build_tiny_model

    from .http_proc import Http, free_port, healthy

    model_dir = build_tiny_model(tmp_path / "mm", arch="qwen3_5", readout="pointer", multimodal=True)
    root = tmp_path / "media"
    root.mkdir()
    _cat(root / "cat.png")
    Image.new("1", (5000, 5000)).save(tmp_path / "bomb.png")
    port = free_port()
    daemon = start_daemon("--media-root", str(root), "--http", f"127.0.0.1:{port}", model=model_dir)
    wait_for(lambda: healthy(port), 60, "the gateway answering /health")
    criteria = {"cat": None, "dog": None, "bird": None}
    with TypeSafeClient(api_key="none", base_url=f"http://127.0.0.1:{port}", retry=None) as client:
        sent = client.system_one(state="what is in the picture?", assets={"photo": SdkImage((root / "cat.png").read_bytes())},
                                 questions={"q": Choice(criteria=criteria)})
    http = Http(port)
    status, _, by_path = http.request("POST", "/v1/systemone", {
        "state": "what is in the picture?", "media": [{"type": "image", "uri": "cat.png"}],
        "questions": {"q": {"type": "choice", "criteria": criteria}}})
    assert status == 200
    for option, p in by_path["answers"]["q"]["probabilities"].items():
        assert abs(sent.choices["q"].probabilities[option] - p) <= 1e-6
    # the media rules hold for an uploaded image as for a file under the root
    from typesafe_sdk._core.multipart import Part, encode_multipart

    body = {"state": "x", "questions": {"q": {"type": "choice", "criteria": criteria}},
            "assets": {"p": {"type": "image", "part": "asset-0"}}}
    kind, raw = encode_multipart([Part("request", "application/json", json.dumps(body).encode()),
                                  Part("asset-0", "image/png", (tmp_path / "bomb.png").read_bytes(), "asset-0")])
    status, _, reply = http.request("POST", "/v1/systemone", None, raw=raw, headers={"Content-Type": kind})
    assert (status, reply["detail"]) == (422, f"image exceeds {4096 * 4096} pixels")
    kind, raw = encode_multipart([Part("request", "application/json", json.dumps(body).encode()),
                                  Part("asset-9", "image/png", b"png", "asset-9")])
    status, _, reply = http.request("POST", "/v1/systemone", None, raw=raw, headers={"Content-Type": kind})
    assert status == 422 and "names part 'asset-0', which the body lacks" in reply["detail"]
    http.close()
    # nothing is left of them: the uploads directory the gateway was given is empty
    gateway = daemon.status()["http"]["pid"]
    argv = Path(f"/proc/{gateway}/cmdline").read_bytes().split(b"\0")
    uploads = Path(argv[argv.index(b"--uploads") + 1].decode())
    assert uploads.is_dir() and (uploads.stat().st_mode & 0o777) == 0o700 and list(uploads.iterdir()) == []
    assert daemon.stop() == 0
