"""Hostile media paths: what a malicious client or another local user tries.

Paths: a hard link into the root, /proc's names for a process's own descriptors and files, a directory
swapped for a symlink behind the checks, NUL bytes, names that only look like `..` or `/`. Each is refused
with its own message, or reads only a file inside the root by its own name. The checker process is asked
about every descriptor it holds, with a media root of / (where nothing is outside).
"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import zmq

from jevany_client.errors import InvalidRequestError
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

