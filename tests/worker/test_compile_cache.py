"""Where compiled kernels are kept: a directory of the worker's own, which nobody else may write to."""
import os
import stat

import pytest

from jevany_daemon.worker.process import UnsafeDirectory, configure_compile_cache


def test_kept_under_the_cache_dir_made_private(tmp_path, monkeypatch):
    monkeypatch.setenv("JEVANY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")       # unset for the call, restored after the test
    path = configure_compile_cache()
    assert path == tmp_path / "cache" / "inductor" and path.is_dir()
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)


def test_a_directory_others_may_write_to_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared / "inductor"))
    with pytest.raises(UnsafeDirectory, match="writable by others.*set TORCHINDUCTOR_CACHE_DIR"):
        configure_compile_cache()
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    (own / "inductor").mkdir(mode=0o770)          # its group could write compiled code in
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(own / "inductor"))
    (own / "inductor").chmod(0o770)
    with pytest.raises(UnsafeDirectory, match="writable by its group"):
        configure_compile_cache()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(theirs))
    with pytest.raises(UnsafeDirectory, match="belongs to uid 65534"):
        configure_compile_cache()
