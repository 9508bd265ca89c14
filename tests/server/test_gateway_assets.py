"""Images sent in a multipart body (gateway/assets.py): the split, and the files they are kept in."""
import os
import stat

import pytest

from jevany_client.errors import InvalidRequestError
from jevany_daemon.gateway.assets import MAX_PARTS, Uploads, split

BOUNDARY = "b0undary"


def _form(*parts: tuple[str, bytes]) -> bytes:
    out = b""
    for name, data in parts:
        out += (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


def _split(*parts):
    return split(_form(*parts), f"multipart/form-data; boundary={BOUNDARY}")


def test_the_request_part_is_the_json_and_the_others_the_images():
    request, parts = _split(("request", b'{"a": 1}'), ("img", b"\x89PNG"))
    assert request == b'{"a": 1}' and parts == {"img": ("application/octet-stream", b"\x89PNG")}


def test_a_request_and_every_image_it_may_carry_and_not_one_more():
    images = [(f"i{n}", b"x") for n in range(MAX_PARTS - 1)]
    assert len(_split(("request", b"{}"), *images)[1]) == MAX_PARTS - 1
    with pytest.raises(InvalidRequestError, match="at most"):
        _split(("request", b"{}"), *images, ("one-more", b"x"))


def test_a_part_twice_or_no_request_part_is_refused():
    with pytest.raises(InvalidRequestError, match="twice"):
        _split(("request", b"{}"), ("i", b"x"), ("i", b"y"))
    with pytest.raises(InvalidRequestError, match="request"):
        _split(("i", b"x"))


def test_an_image_is_kept_where_only_the_daemon_may_read_it_and_removed_after(tmp_path):
    uploads = Uploads(str(tmp_path))
    paths = uploads.place({"a": {"type": "image", "part": "p"}, "b": {"type": "image", "part": "q"}},
                          {"q": ("image/png", b"second"), "p": ("image/png", b"first")})
    assert [open(p, "rb").read() for p in paths] == [b"first", b"second"]      # in the assets' order
    assert {stat.S_IMODE(os.stat(p).st_mode) for p in paths} == {0o600}
    uploads.remove(paths)
    assert list(tmp_path.iterdir()) == []


def test_every_part_claimed_by_exactly_one_asset(tmp_path):
    uploads = Uploads(str(tmp_path))
    parts = {"p": ("image/png", b"x"), "q": ("image/png", b"y")}
    for assets in ({"a": {"type": "image", "part": "p"}},
                   {"a": {"type": "image", "part": "p"}, "b": {"type": "image", "part": "p"}},
                   {"a": {"type": "image", "part": "p"}, "b": {"type": "image", "part": "nope"}},
                   {"a": {"type": "video", "part": "p"}, "b": {"type": "image", "part": "q"}}):
        with pytest.raises(InvalidRequestError):
            uploads.place(assets, parts)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InvalidRequestError, match="disabled"):
        Uploads(None).place({"a": {"type": "image", "part": "p"}}, parts)
