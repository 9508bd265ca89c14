"""Compressed request bodies decoded within the cap (gateway/encodings.py), in process."""
import gzip

import pytest
from backports.zstd import compress

from jevany_daemon.gateway.encodings import MAX_FRAMES, BodyEncodingError, decode


def test_identity_and_no_encoding_are_the_body_as_it_is():
    for name in ("", "identity", " Identity "):
        assert decode(b"not compressed", name, 100) == b"not compressed", name


def test_up_to_max_frames_are_decoded_and_one_more_is_refused():
    for pack, name in ((compress, "zstd"), (gzip.compress, "gzip")):
        assert decode(pack(b"ab") * MAX_FRAMES, name, 1000) == b"ab" * MAX_FRAMES
        with pytest.raises(BodyEncodingError) as refused:
            decode(pack(b"ab") * (MAX_FRAMES + 1), name, 1000)
        assert refused.value.status == 400, name


def test_a_body_cut_inside_a_frame_is_refused():
    for pack, name in ((compress, "zstd"), (gzip.compress, "gzip")):
        whole = pack(b"x" * 500)
        with pytest.raises(BodyEncodingError) as refused:
            decode(whole[:-4], name, 1000)
        assert refused.value.status == 400, name


def test_an_unknown_encoding_is_415():
    with pytest.raises(BodyEncodingError) as refused:
        decode(b"{}", "br", 100)
    assert refused.value.status == 415


def test_a_body_decoding_to_exactly_the_limit_decodes_and_one_byte_more_is_413():
    # limit is the most a body may decode to: a body of exactly limit bytes is allowed, as a plain one is.
    for pack, name in ((compress, "zstd"), (gzip.compress, "gzip")):
        assert decode(pack(b"x" * 1000), name, 1000) == b"x" * 1000, name
        assert decode(pack(b"x" * 400) + pack(b"y" * 600), name, 1000) == b"x" * 400 + b"y" * 600, name
        with pytest.raises(BodyEncodingError) as refused:
            decode(pack(b"x" * 1001), name, 1000)
        assert refused.value.status == 413, name
