"""Which ipc socket paths the client trusts: nobody but the user (or root) may swap the socket there."""
import os
import stat

import pytest

from jevany_client import ipc_trust
from jevany_client.ipc_trust import ipc_problem, socket_file_problem

OTHER = 4242        # a uid that is neither root nor the user checking


def fake_stat(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))


@pytest.fixture
def tree(monkeypatch):
    """A made-up filesystem: {path: (mode, owner)}; a path it lacks does not exist.

    Owners other than the user running the tests cannot be made without root, so the walk reads these."""
    entries: dict[str, tuple[int, int]] = {}

    def lstat(path):
        path = os.fspath(path)
        if path not in entries:
            raise FileNotFoundError(2, "No such file or directory", path)
        return fake_stat(*entries[path])

    monkeypatch.setattr(ipc_trust.os, "lstat", lstat)
    return entries


def test_a_group_writable_directory_is_refused(tmp_path):
    box = tmp_path / "box"
    box.mkdir()
    box.chmod(0o770)
    problem = ipc_problem(box / "daemon.sock")
    assert problem is not None and "writable by its group" in problem and str(box) in problem
    box.chmod(0o700)
    assert ipc_problem(box / "daemon.sock") is None


def test_a_world_writable_sticky_directory_counts_as_shared_only_when_root_owns_it(tree):
    tree["/shared"] = (stat.S_IFDIR | 0o1777, 0)
    assert ipc_problem("/shared/jevany/daemon.sock", uid=1000) is None
    tree["/shared"] = (stat.S_IFDIR | 0o1777, OTHER)         # its owner can rename any entry away
    problem = ipc_problem("/shared/jevany/daemon.sock", uid=1000)
    assert problem is not None and "/shared is writable by others" in problem


def test_under_a_shared_directory_the_socket_file_must_be_the_users_or_roots(tree):
    tree["/shared"] = (stat.S_IFDIR | 0o1777, 0)
    tree["/shared/daemon.sock"] = (stat.S_IFSOCK | 0o600, OTHER)
    problem = socket_file_problem("/shared/daemon.sock", uid=1000)
    assert problem is not None and f"belongs to uid {OTHER}" in problem
    for owner in (1000, 0):
        tree["/shared/daemon.sock"] = (stat.S_IFSOCK | 0o600, owner)
        assert socket_file_problem("/shared/daemon.sock", uid=1000) is None


def test_outside_a_shared_directory_the_socket_file_owner_is_not_checked(tree):
    tree["/home"] = (stat.S_IFDIR | 0o755, 0)
    tree["/home/daemon.sock"] = (stat.S_IFSOCK | 0o600, OTHER)
    assert socket_file_problem("/home/daemon.sock", uid=1000) is None


def test_a_directory_of_another_user_below_a_shared_one_is_refused(tree):
    tree["/shared"] = (stat.S_IFDIR | 0o1777, 0)
    tree["/shared/jevany"] = (stat.S_IFDIR | 0o700, OTHER)   # made first by someone else
    problem = ipc_problem("/shared/jevany/daemon.sock", uid=1000)
    assert problem is not None and f"/shared/jevany belongs to uid {OTHER}" in problem


def test_a_symlink_on_the_way_is_refused(tree):
    tree["/run"] = (stat.S_IFLNK | 0o777, 0)
    problem = ipc_problem("/run/jevany/daemon.sock", uid=1000)
    assert problem is not None and "symlink" in problem
