"""The HTTP settings' vocabulary (jevany_daemon/http_options.py): how CORS origins are written."""
import pytest

from jevany_daemon.http_options import cors_origins


def test_origins_are_any_none_or_a_list():
    assert cors_origins("*") == ["*"]
    assert cors_origins("") == [] and cors_origins(" , ") == []
    assert cors_origins(" https://a.example , http://[::1]:8080,http://b:1 ") == [
        "https://a.example", "http://[::1]:8080", "http://b:1"]


@pytest.mark.parametrize("value", ["a.example", "https://a.example/path", "*, https://a.example",
                                   "https://a.example:123456", "ftp://a.example", None])
def test_anything_else_is_refused(value):
    with pytest.raises(ValueError):
        cors_origins(value)
