"""Hostile media paths and a full run directory: what a malicious client or another local user tries.

Paths: a hard link into the root, /proc's names for a process's own descriptors and files, a directory
swapped for a symlink behind the checks, NUL bytes, names that only look like `..` or `/`. Each is refused
with its own message, or reads only a file inside the root by its own name. The checker process is asked
about every descriptor it holds, with a media root of / (where nothing is outside).

A full run directory: the daemon runs in a mount namespace of its own whose temporary directory, where
it makes its run directory and uploads directory, is a 1 MiB tmpfs (which needs root), filled by the
test: the kernel's own ENOSPC, after a short write. Quotas (EDQUOT) and a disk's EIO cannot be made
here, so they are injected into the uploads' writes, as is ENOSPC again for hosts that are not root.
"""
import ctypes
import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import msgpack
import pytest
import zmq

from jevany_client.errors import InvalidRequestError
from jevany_daemon.gateway.assets import Uploads
from jevany_daemon.media.policy import MediaPolicy

Image = pytest.importorskip("PIL.Image")

MOVED = "media path changed while it was opened; send the request again"
LINKED = "media file has other hard links and is not readable by everyone; put a copy of it in JEVANY_MEDIA_ROOT"
IN_PROC = "media path is under /proc: a process's own files, not media"
NUL = "media path contains a NUL byte"
NOT_THERE, OUTSIDE = "media file does not exist", "media path is outside JEVANY_MEDIA_ROOT"
NOBODY = 65534


def _png(path: Path, colour=(200, 10, 10)) -> Path:
    Image.new("RGB", (8, 8), colour).save(path)
    return path


@pytest.fixture
def tree(tmp_path):
    """A media root with ok.png, beside it secret.png (0600, nobody's when we are root) and a pipe."""
    root = tmp_path / "media"
    root.mkdir()
    _png(root / "ok.png")
    secret = _png(tmp_path / "secret.png", (1, 2, 3))
    secret.chmod(0o600)
    if os.getuid() == 0:
        os.chown(secret, NOBODY, NOBODY)
    return root, secret


def _outcome(policy: MediaPolicy, uri: str):
    """The refusal's message, or the digest of the bytes the policy checked."""
    try:
        [(_, _, (_, digest))] = policy.check([("image", uri)])
    except InvalidRequestError as exc:
        return exc.message
    return digest


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- hard links -----------------------------------------------------------------------------------------


def test_a_hard_link_to_a_private_file_is_refused_and_one_everyone_may_read_is_served(tree):
    root, secret = tree
    os.link(secret, root / "linked.png")         # another user's 0600 file, now with a name in the root
    policy = MediaPolicy(str(root))
    # Before: served (the path is inside the root; nothing looked at st_nlink or the mode).
    assert _outcome(policy, "linked.png") == LINKED
    # What a link to a file everyone may read gives nobody anything new: served, as a copy would be.
    secret.chmod(0o644)
    assert _outcome(policy, "linked.png") == _digest(secret)
    # And a private file with one name, the root's usual case, is served as before.
    (root / "ok.png").chmod(0o600)
    assert _outcome(policy, "ok.png") == _digest(root / "ok.png")


# --- /proc and /dev/fd ----------------------------------------------------------------------------------


def test_proc_paths_read_only_a_file_inside_the_root_by_its_own_name(tree):
    root, secret = tree
    policy, pid = MediaPolicy(str(root)), os.getpid()
    outside = os.open(secret, os.O_RDONLY)          # this process's own descriptors, onto a file outside ...
    inside = os.open(root / "ok.png", os.O_RDONLY)  # ... and one inside
    reader, writer = os.pipe()
    try:
        for uri in (f"/proc/self/fd/{outside}", f"/proc/{pid}/fd/{outside}", f"/dev/fd/{outside}",
                    f"/proc/thread-self/fd/{outside}", f"/proc/{pid}/root{secret}", "/proc/self/environ"):
            assert _outcome(policy, uri) == OUTSIDE, uri
        assert _outcome(policy, f"/proc/self/fd/{reader}") == NOT_THERE       # "pipe:[N]" is no path
        # A descriptor onto a file inside the root, or the root through /proc/PID/root: that file, read
        # by its own path (the policy reports it), never through the descriptor.
        for uri in (f"/proc/self/fd/{inside}", f"/proc/{pid}/root{root}/ok.png"):
            [(_, path, (_, digest))] = policy.check([("image", uri)])
            assert (path, digest) == (root / "ok.png", _digest(root / "ok.png")), uri
    finally:
        for fd in (outside, inside, reader, writer):
            os.close(fd)
    # Where the root is / and nothing is outside, /proc's files are still no media. Before: read, and
    # handed to the decoders ("media file could not be validated").
    everything = MediaPolicy("/")
    for uri in ("/proc/self/environ", f"/proc/{pid}/cmdline", "/proc/self/status"):
        assert _outcome(everything, uri) == IN_PROC, uri


def test_a_directory_swapped_for_a_symlink_behind_the_checks_leads_nowhere(tree, monkeypatch):
    root, secret = tree
    (root / "d").mkdir()
    _png(root / "d" / "a.png")
    real_access = os.access

    def access_then_swap(path, mode, *args, **kwargs):
        # The path is resolved and checked; the attacker, who may write in the root, swaps the
        # directory on it for a symlink to the secret's just now.
        allowed = real_access(path, mode, *args, **kwargs)
        if Path(path) == root / "d" / "a.png" and not (root / "d").is_symlink():
            os.rename(root / "d", root / "d.old")
            os.symlink(secret.parent, root / "d")
            (secret.parent / "a.png").write_bytes(secret.read_bytes())
        return allowed

    monkeypatch.setattr(os, "access", access_then_swap)
    # Before: the open followed the new symlink (O_NOFOLLOW guards the last name only) and the
    # secret's bytes were checked and stamped.
    assert _outcome(MediaPolicy(str(root)), "d/a.png") == MOVED


# --- NUL bytes, and names that look like others ---------------------------------------------------------


def test_nul_bytes_and_names_with_no_bytes_are_refused_by_name(tree):
    root, _ = tree
    policy = MediaPolicy(str(root))
    # Before: Python's ValueError ("embedded null byte"), which the checker turned into "media file could
    # not be validated" and an in-process caller got raw.
    for uri in ("ok.png\0../../secret.png", "\0", "ok.png\0"):
        assert _outcome(policy, uri) == NUL, repr(uri)
    assert _outcome(policy, "\ud800.png") == "media path is not a valid file name"     # a lone surrogate
    # A name that is not UTF-8 still names its bytes (surrogateescape): the file inside the root.
    _png(Path(os.fsdecode(bytes(root) + b"/\xff.png")))
    assert _outcome(policy, "\udcff.png") == _digest(Path(os.fsdecode(bytes(root) + b"/\xff.png")))


def test_lookalikes_of_dots_and_slashes_and_unnormalised_names_are_the_bytes_they_are(tree):
    # Passed before too: nothing normalises a path (NFC, NFKC), so the name checked is the name opened.
    root, secret = tree
    secret.chmod(0o644)
    policy = MediaPolicy(str(root))
    escapes = ["..\uff0fsecret.png",                 # fullwidth solidus: NFKC makes it ../secret.png
               "\uff0e\uff0e/secret.png",            # fullwidth full stops
               "\u2025/secret.png",                  # two dot leader, NFKC ".."
               "\u2024\u2024/secret.png",            # one dot leaders
               ".\u0307./secret.png",                # a combining dot above between the dots
               "\u200b../secret.png"]                # a zero-width space before them
    for uri in escapes:
        assert _outcome(policy, uri) == NOT_THERE, uri
    # Files with those names inside the root are themselves, not the secret.
    _png(root / "..\uff0fsecret.png", (9, 9, 9))
    (root / "\u2025").mkdir()
    _png(root / "\u2025" / "secret.png", (7, 7, 7))
    assert _outcome(policy, "..\uff0fsecret.png") == _digest(root / "..\uff0fsecret.png") != _digest(secret)
    assert _outcome(policy, "\u2025/secret.png") == _digest(root / "\u2025" / "secret.png") != _digest(secret)
    # NFD and NFC spellings of one name are two names.
    _png(root / "cafe\u0301.png")
    assert _outcome(policy, "caf\u00e9.png") == NOT_THERE
    assert _outcome(policy, "cafe\u0301.png") == _digest(root / "cafe\u0301.png")


# --- the checker process and its own descriptors ------------------------------------------------------


def test_the_checker_reads_none_of_its_own_descriptors_even_with_a_root_of_slash(tmp_path):
    settings = {"media_root": "/", "media_max_bytes": 1 << 20, "media_total_bytes": 1 << 20,
                "media_max_pixels": 1 << 20, "media_max_video_frames": 10}
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"ipc://{tmp_path}/media.sock")
    checker = subprocess.Popen([sys.executable, "-m", "jevany_daemon.media.checker", "--endpoint",
                                f"ipc://{tmp_path}/media.sock", "--identity", "m", "--settings",
                                json.dumps(settings)], stdin=subprocess.DEVNULL)
    try:
        assert sock.poll(30_000), "no hello from the checker"
        ident, hello = sock.recv_multipart()
        assert msgpack.unpackb(hello) == ["hello"]
        fds = sorted(int(fd) for fd in os.listdir(f"/proc/{checker.pid}/fd"))
        uris = [f"/proc/self/fd/{fd}" for fd in fds] + [f"/proc/{checker.pid}/fd/{fd}" for fd in fds]
        uris += ["/proc/self/environ", "/proc/self/mem", f"/proc/{checker.pid}/root/proc/self/cmdline",
                 "/proc/self/cwd/../../proc/self/environ", "/etc/passwd\0.png"]
        answers = {}
        for tag, uri in enumerate(uris):
            sock.send_multipart([ident, msgpack.packb([tag, [["image", uri]]])])
            assert sock.poll(30_000), f"no answer for {uri}"
            answer = msgpack.unpackb(sock.recv_multipart()[1])
            assert answer[:2] == [tag, False], (uri, answer)
            answers[uri] = answer[2]
        # Refused by what the path is, before a byte of it is read: never "media file could not be
        # validated", which only bytes handed to a decoder earn (before: /proc/self/environ and
        # /proc/self/mem were read, and the NUL refused so, by a ValueError).
        expected = {NOT_THERE, IN_PROC, NUL, "media path is not a regular file"}
        assert set(answers.values()) <= expected, {u: m for u, m in answers.items() if m not in expected}
        assert answers["/proc/self/environ"] == IN_PROC and answers["/etc/passwd\0.png"] == NUL
        assert checker.poll() is None           # the same checker, answering
    finally:
        checker.kill()
        checker.wait(10)
        ctx.destroy(linger=0)


# --- no room in the run directory -----------------------------------------------------------------------


@pytest.mark.parametrize("code", [errno.EDQUOT, errno.ENOSPC, errno.EIO])
def test_an_upload_with_no_room_leaves_nothing_behind_and_says_to_retry(tmp_path, monkeypatch, code):
    uploads = tmp_path / "uploads"
    uploads.mkdir(mode=0o700)
    room = [1500]               # bytes the disk takes: the first image whole, then half the second
    real_write = os.write

    def write(fd, data):
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(f"{uploads}/"):
            return real_write(fd, data)
        if not room[0]:
            raise OSError(code, os.strerror(code))
        done = real_write(fd, bytes(data[:room[0]]))      # a short write, as the kernel's when space ends
        room[0] -= done
        return done

    monkeypatch.setattr(os, "write", write)
    parts = {"a": ("image/png", b"a" * 1000), "b": ("image/png", b"b" * 1000)}
    with pytest.raises(InvalidRequestError) as refused:
        Uploads(str(uploads)).place({"p": {"type": "image", "part": "a"}, "q": {"type": "image", "part": "b"}}, parts)
    assert room == [0] and list(uploads.iterdir()) == []      # before: half of b's image was left there
    if code == errno.EIO:       # the disk's fault, not a lack of room: as before, not worth retrying
        assert (refused.value.code, refused.value.retryable) == ("invalid_request", False)
    else:
        # Before: invalid_request (422), as if the image were at fault.
        assert (refused.value.code, refused.value.retryable) == ("overloaded", True)
        assert refused.value.message == (f"the daemon has no room to keep the uploaded image ({os.strerror(code)}); "
                                         "retry later")


CLONE_NEWNS, MS_REC, MS_PRIVATE = 0x20000, 0x4000, 0x40000
RUN_BYTES = 1 << 20


def _on_a_small_tmpfs(run: Path):
    """preexec: the daemon in a mount namespace of its own, where run is a tmpfs of RUN_BYTES; gone with it."""
    def preexec():
        libc = ctypes.CDLL(None, use_errno=True)
        for rc in (libc.unshare(CLONE_NEWNS),
                   libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None),      # nothing leaks to the host
                   libc.mount(b"tmpfs", bytes(run), b"tmpfs", 0, f"size={RUN_BYTES},mode=0700".encode())):
            if rc != 0:
                raise OSError(ctypes.get_errno(), "mounting a tmpfs in a namespace of its own")

    return preexec


@pytest.fixture(scope="module")
def full_daemon(tiny_model):
    from tests.server.daemons import wait_for
    from tests.server.http_proc import free_port, healthy
    from tests.server.shared_daemons import running_daemon

    if os.geteuid() != 0:
        # A user namespace would let anyone mount one, but then the daemon's /tmp is not root's to the
        # client's socket checks, which rightly refuse it.
        pytest.skip("mounting a tmpfs for the daemon needs root")
    directory = Path(tempfile.mkdtemp(prefix="jvd-"))
    run, media = directory / "run", directory / "media"
    run.mkdir()
    media.mkdir()
    port = free_port()
    try:
        daemon = running_daemon(tiny_model("qwen3", "choice"), "--http", f"127.0.0.1:{port}", "--media-root",
                                str(media), env={"TMPDIR": str(run)}, preexec=_on_a_small_tmpfs(run),
                                directory=directory)
        d = daemon.__enter__()
    except subprocess.SubprocessError as exc:       # a root without CAP_SYS_ADMIN (a container)
        shutil.rmtree(directory)
        pytest.skip(f"cannot mount a tmpfs in a namespace of the daemon's own: {exc}")
    try:
        wait_for(lambda: healthy(port), 60, "the gateway answering /health")
        d.port, d.gateway = port, d.status()["http"]["pid"]
        argv = Path(f"/proc/{d.gateway}/cmdline").read_bytes().split(b"\0")
        # The uploads directory as the daemon sees it, and where this process reaches its namespace's view.
        d.uploads = Path(f"/proc/{d.proc.pid}/root") / argv[argv.index(b"--uploads") + 1].decode().lstrip("/")
        d.run = Path(f"/proc/{d.proc.pid}/root") / str(run).lstrip("/")
        assert d.uploads.is_relative_to(d.run)
        yield d
    finally:
        daemon.__exit__(None, None, None)


def _fill(run: Path, leave: int) -> Path:
    """Fill run's file system, then free `leave` bytes of it."""
    filler = run / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * (256 << 10)
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    os.truncate(filler, filler.stat().st_size - leave)
    return filler


def test_a_full_run_directory_costs_an_upload_429_retry_after_and_nothing_else(full_daemon):
    from typesafe_sdk._core.multipart import Part, encode_multipart

    from tests.server.http_proc import Http

    criteria = {"cat": None, "dog": None}
    text = {"state": "x", "questions": {"q": {"type": "choice", "criteria": criteria}}}
    noise = io.BytesIO()
    Image.frombytes("RGB", (128, 128), os.urandom(128 * 128 * 3)).save(noise, "PNG")    # ~48 KiB, incompressible
    request = {**text, "assets": {"p": {"type": "image", "part": "i"}}}
    kind, raw = encode_multipart([Part("request", "application/json", json.dumps(request).encode()),
                                  Part("i", "image/png", noise.getvalue(), "i")])
    upload = {"raw": raw, "headers": {"Content-Type": kind}}
    http = Http(full_daemon.port, timeout=60)
    filler = _fill(full_daemon.run, 16 << 10)     # 16 KiB left: the image's first write is short, the next fails
    try:
        status, headers, reply = http.request("POST", "/v1/systemone", None, **upload)
        # Before: 422 invalid_request ("could not be kept for checking"), and the 16 KiB written left behind.
        assert (status, headers.get("retry-after"), headers.get("x-jevany-daemon-error")) == (429, "1", "overloaded")
        assert reply["detail"] == ("the daemon has no room to keep the uploaded image (No space left on device); "
                                   "retry later")
        assert list(full_daemon.uploads.iterdir()) == []
        # Text needs no room: served all along.
        status, _, reply = http.request("POST", "/v1/systemone", text)
        assert status == 200 and set(reply["answers"]["q"]["probabilities"]) == {"cat", "dog"}
    finally:
        filler.unlink()
    # Room again: the same upload is kept, checked, answered (by the worker: a text model's refusal of
    # media, 422) and removed; the same gateway throughout.
    status, _, reply = http.request("POST", "/v1/systemone", None, **upload)
    assert (status, reply["detail"]) == (422, "choice readout does not support media requests")
    assert list(full_daemon.uploads.iterdir()) == []
    assert full_daemon.status()["http"]["pid"] == full_daemon.gateway
    http.close()
