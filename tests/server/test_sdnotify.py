"""systemd's notification protocol: the address, the watchdog interval, and what workers inherit (no systemd:
a datagram socket of the test's own)."""
import os
import socket

import pytest

from jevany_daemon.server.sdnotify import Notifier, worker_environment


def test_the_watchdog_interval_is_half_of_watchdog_usec_and_ours_only_where_the_pid_is_ours():
    assert Notifier({"WATCHDOG_USEC": "2000000"}).watchdog_s == 1.0
    assert Notifier({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_s == 1.0
    assert Notifier({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)}).watchdog_s is None
    assert Notifier({"WATCHDOG_USEC": "0"}).watchdog_s is None
    assert Notifier({"WATCHDOG_USEC": "soon"}).watchdog_s is None


@pytest.mark.parametrize("abstract", [True, False])
def test_each_message_is_one_datagram_to_the_named_socket(tmp_path, abstract):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.settimeout(10)      # a datagram sent elsewhere fails the test rather than hanging it
    name = f"jevany-sd-{os.getpid()}"
    server.bind("\0" + name if abstract else str(tmp_path / "notify"))
    try:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name if abstract else str(tmp_path / "notify")})
        notifier.stopping("draining")
        notifier.reloading(1234)
        assert server.recv(4096) == b"STOPPING=1\nSTATUS=draining"
        assert server.recv(4096) == b"RELOADING=1\nMONOTONIC_USEC=1234\nSTATUS=reloading"
        notifier.close()
    finally:
        server.close()


def test_a_notify_socket_that_is_not_a_unix_path_is_ignored():
    assert not Notifier({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled


def test_workers_inherit_everything_but_what_systemd_meant_for_the_main_process():
    env = {"NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "PATH": "/bin", "HOME": "/h"}
    assert worker_environment(env) == {"PATH": "/bin", "HOME": "/h"}
