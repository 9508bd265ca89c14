"""Hostile media files: a FIFO swapped in behind the checks, a file changed after its check, a
video whose frames outgrow its header. Each gets its typed refusal at once, and nothing blocks."""
import io
import os
import threading
import time
from fractions import Fraction

import numpy as np
import pytest

from jevany_client.errors import InvalidRequestError
from jevany_daemon.media.policy import MediaPolicy

av = pytest.importorskip("av")
Image = pytest.importorskip("PIL.Image")


@pytest.fixture
def root(tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    return media


def test_a_fifo_renamed_in_after_the_path_checks_is_refused_without_blocking(root, monkeypatch):
    Image.new("RGB", (32, 24)).save(root / "a.png")
    fifo = root / "fifo"
    real_access = os.access

    def access_then_swap(path, mode, *args, **kwargs):
        # The checker has looked at the path; an attacker renames a FIFO over the file just now.
        allowed = real_access(path, mode, *args, **kwargs)
        if str(path).endswith("a.png") and not fifo.exists() and (root / "a.png").is_file():
            os.mkfifo(fifo)
            os.rename(fifo, root / "a.png")
        return allowed

    monkeypatch.setattr(os, "access", access_then_swap)
    outcome = {}
    check = threading.Thread(target=lambda: outcome.update(_refusal(MediaPolicy(str(root)), "a.png")), daemon=True)
    started = time.monotonic()
    check.start()
    check.join(5)
    if check.is_alive():              # blocked in open(): let it go, so the test ends either way
        os.close(os.open(root / "a.png", os.O_WRONLY))
        check.join(5)
    assert time.monotonic() - started < 5, "the check blocked on a FIFO (before: 10 s and a killed checker)"
    assert outcome == {"message": "media path is not a regular file"}


def _refusal(policy, uri) -> dict:
    try:
        policy.resolve([("image", uri)])
    except InvalidRequestError as exc:
        return {"message": exc.message}
    return {"message": None}


def test_the_worker_decodes_its_own_copy_of_what_was_checked_whatever_the_path_becomes(root):
    from jevany_daemon.media.files import PrivateCopies, read_verified

    Image.new("RGB", (32, 24), (200, 10, 10)).save(root / "a.png")
    [(_, path, stamp)] = MediaPolicy(str(root)).check([("image", "a.png")])
    copies = PrivateCopies()
    try:
        private = copies.add(read_verified(path, stamp))
        path.unlink()
        os.mkfifo(path)                       # the path now names a FIFO
        with Image.open(private) as image:    # what a decoder opens: the checked bytes, at once
            assert image.size == (32, 24) and image.convert("RGB").getpixel((0, 0)) == (200, 10, 10)
        with pytest.raises(InvalidRequestError, match="changed after it was checked"):
            read_verified(path, stamp)        # and a second read of the path is refused, not blocked on
    finally:
        copies.close()


def test_a_private_copy_is_closed_on_exec_so_no_child_of_the_worker_holds_it():
    # A decoder may run a helper program (ffmpeg); an inherited copy would outlive its request there.
    from jevany_daemon.media.files import PrivateCopies

    copies = PrivateCopies()
    try:
        private = copies.add(b"checked bytes")
        fd = int(private.rsplit("/", 1)[1])
        assert not os.get_inheritable(fd)
        with open(private, "rb") as f:
            assert f.read() == b"checked bytes"
    finally:
        copies.close()
    assert copies.fds == []


def test_bytes_rewritten_in_place_with_size_time_and_inode_kept_are_refused(root):
    from jevany_daemon.media.files import read_verified

    Image.new("RGB", (32, 24)).save(root / "a.png")
    [(_, path, stamp)] = MediaPolicy(str(root)).check([("image", "a.png")])
    st = path.stat()
    with open(path, "r+b") as f:            # what the old stamp (size, mtime, inode) could not see
        f.seek(st.st_size - 4)
        f.write(b"\xde\xad\xbe\xef")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns, path.stat().st_ino) == (st.st_size, st.st_mtime_ns,
                                                                                   st.st_ino)
    with pytest.raises(InvalidRequestError, match="changed after it was checked"):
        read_verified(path, stamp)


def test_a_final_symlink_is_refused_and_the_cap_holds_on_what_is_read_not_on_the_size_reported(root):
    from jevany_daemon.media.files import read_regular

    (root / "a.png").write_bytes(b"x" * 16)
    (root / "link.png").symlink_to(root / "a.png")      # a symlink swapped in behind the path checks
    with pytest.raises(InvalidRequestError, match="not a regular file"):
        read_regular(root / "link.png", 100)
    assert read_regular(root / "a.png", 16) == b"x" * 16                # at the cap: read whole
    with pytest.raises(InvalidRequestError, match="exceeds 15 bytes"):
        read_regular(root / "a.png", 15)
    # A file that grows while it is read, as /proc's do: fstat says 0 bytes, and more come.
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(InvalidRequestError, match="exceeds 16 bytes"):
        read_regular("/proc/self/status", 16)


def _lying_avi(path, big=(640, 480), frames=7):
    """One 64x48 frame, as the header says, then bigger ones (MJPEG frames carry their own size)."""
    with av.open(str(path), "w", format="avi") as out:
        stream = out.add_stream("mjpeg", rate=Fraction(4, 1))
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuvj420p"
        first = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 90, np.uint8), format="rgb24")
        packets = list(stream.encode(first.reformat(format="yuvj420p")))
        for packet in packets:
            out.mux(packet)
        for i in range(frames):
            jpeg = io.BytesIO()
            Image.new("RGB", big, (30 * i, 0, 0)).save(jpeg, "JPEG")
            packet = av.Packet(jpeg.getvalue())
            packet.stream, packet.pts, packet.dts = stream, packets[-1].pts + 1 + i, packets[-1].pts + 1 + i
            out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def test_a_video_whose_frames_outgrow_its_header_is_refused_at_the_first_such_frame(root):
    from jevany_daemon.media.frames import FrameSizeError, frames_as_declared

    path = _lying_avi(root / "lie.avi")
    # Its header passes the checks (64x48 under the pixel cap, 8 frames declared) ...
    assert MediaPolicy(str(root), max_pixels=64 * 48).resolve([("video", "lie.avi")])
    # ... and what decodes it (the worker's read_video) stops at the first frame that is not that size:
    # before, all of them were decoded (1.9 GB at 8000x8000), then a ValueError came back as internal.
    seen = []
    with av.open(str(path)) as container, pytest.raises(FrameSizeError) as err:
        for i, frame in frames_as_declared(container, container.streams.video[0], 7):
            seen.append((i, frame.width, frame.height))
    assert seen == [(0, 64, 48)] and str(err.value) == "video frame 1 is 640x480, not the 64x48 its header declares"
