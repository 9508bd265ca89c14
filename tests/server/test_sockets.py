"""The client-facing ROUTER sockets: an ipc file's mode while refusing peers, its removal at exit only while
it is ours, CURVE on TCP alone, and the advice for a port in use (real sockets, no daemon)."""
import os
import socket
import stat

import pytest
import zmq

from jevany_daemon.server.sockets import StartupError, bind_router


@pytest.fixture
def ctx():
    context = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_an_ipc_file_is_closed_to_newcomers_while_refusing_and_opened_to_its_mode_again(ctx, tmp_path):
    path = tmp_path / "s" / "d.sock"
    _, listener = bind_router(ctx, f"ipc://{path}", 1 << 20, mode=0o660)
    assert mode(path) == 0o660 and mode(path.parent) == 0o700
    listener.stop()
    assert mode(path) == 0 and not listener.taking
    listener.resume()
    assert mode(path) == 0o660 and listener.taking


def test_the_socket_file_is_removed_at_exit_only_while_it_is_still_ours(ctx, tmp_path):
    path = tmp_path / "d.sock"
    _, listener = bind_router(ctx, f"ipc://{path}", 1 << 20)
    path.unlink()
    path.write_text("another daemon's, since")
    listener.remove_file()
    assert path.read_text() == "another daemon's, since"
    _, ours = bind_router(ctx, f"ipc://{tmp_path / 'e.sock'}", 1 << 20)
    ours.remove_file()
    assert not (tmp_path / "e.sock").exists()


def test_curve_secures_tcp_and_leaves_ipc_to_its_file_mode(ctx, tmp_path):
    public, secret = zmq.curve_keypair()
    tcp, _ = bind_router(ctx, "tcp://127.0.0.1:0", 1 << 20, curve_keys=(public, secret))
    ipc, _ = bind_router(ctx, f"ipc://{tmp_path / 'c.sock'}", 1 << 20, curve_keys=(public, secret))
    assert tcp.getsockopt(zmq.CURVE_SERVER) == 1 and ipc.getsockopt(zmq.CURVE_SERVER) == 0


def test_a_port_in_use_names_the_loopback_address_to_ask_for_a_wildcard_bind(ctx):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartupError, match=rf"--status-flag\): .*--endpoint tcp://127\.0\.0\.1:{port}`"):
            bind_router(ctx, f"tcp://*:{port}", 1 << 20, flag="--status-flag")
