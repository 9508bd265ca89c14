"""The supervisor's side of the gateway (server/gateway_handle.py): restarts and their backoff, on a fake clock.

The process is a stand-in that has exited; the sockets are real (a loopback port, an ipc ROUTER).
"""
from types import SimpleNamespace

import pytest
import zmq

from jevany_daemon.server import gateway_handle
from jevany_daemon.server.gateway_handle import MAX_BACKOFF_S, STABLE_AFTER_S, GatewayProcess


class Exited:
    pid, returncode = 4242, 1

    def poll(self):
        return self.returncode


@pytest.fixture
def handle(tmp_path, monkeypatch):
    """(the GatewayProcess, the fake clock's time as a one-item list, the times it spawned at)."""
    now, spawned = [100.0], []
    ctx = zmq.Context()
    poller = zmq.Poller()
    settings = SimpleNamespace(http="127.0.0.1:0", max_message_bytes=1 << 20, media_root=None)
    gateway = GatewayProcess(ctx, poller, str(tmp_path), settings, lambda: now[0])

    def spawn():
        spawned.append(now[0])
        gateway.proc, gateway.started_at = Exited(), now[0]

    monkeypatch.setattr(gateway, "_spawn", spawn)
    spawn()
    yield gateway, now, spawned
    gateway.proc = None
    gateway.close()
    ctx.term()


def _dies_after(gateway, now, lived: float) -> float:
    """The gateway exits having lived `lived` seconds; the pause before its successor."""
    now[0] += lived
    gateway.watch()
    return gateway.backoff_s


def test_a_gateway_that_keeps_dying_waits_longer_each_time_up_to_the_cap(handle):
    gateway, now, spawned = handle
    pauses = []
    for _ in range(8):
        pauses.append(_dies_after(gateway, now, 1.0))
        assert gateway.wait_s() == pauses[-1] and gateway.describe()["state"] == "restarting"
        now[0] += pauses[-1]
        gateway.watch()        # the pause is over: the successor starts now, not later
    assert pauses == [0.25, 0.5, 1.0, 2.0, 4.0, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert len(spawned) == 9 and gateway.restarts == 8


def test_one_that_lived_long_enough_restarts_at_once(handle):
    gateway, now, spawned = handle
    _dies_after(gateway, now, 1.0)
    now[0] += gateway.backoff_s
    gateway.watch()
    assert _dies_after(gateway, now, STABLE_AFTER_S) == 0.0
    assert spawned[-1] == now[0] and gateway.describe()["state"] == "up"


def test_no_successor_when_restarts_are_off(handle):
    gateway, now, spawned = handle
    now[0] += STABLE_AFTER_S
    gateway.watch(restart=False)
    assert (len(spawned), gateway.proc, gateway.wait_s()) == (1, None, None)


def test_a_port_in_use_is_a_start_up_error_naming_it(tmp_path):
    import socket

    from jevany_daemon.server.sockets import StartupError

    taken = socket.create_server(("127.0.0.1", 0))
    try:
        port = taken.getsockname()[1]
        with pytest.raises(StartupError, match=f"127.0.0.1:{port}"):
            gateway_handle._listen(f"127.0.0.1:{port}")
    finally:
        taken.close()
