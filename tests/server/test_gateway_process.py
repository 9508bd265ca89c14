"""The gateway process's set-up (gateway/process.py): what it hands uvicorn, the guard and the upstream,
checked with uvicorn's serving replaced (nothing listens); and its watch on the supervisor."""
import asyncio
import json
import logging
import os
import socket

import pytest

from jevany_daemon.gateway import process
from jevany_daemon.gateway.connections import BUFFER_BUDGET_MESSAGES, GuardedHttp
from jevany_daemon.logs import FloodFilter
from jevany_daemon.tenants import http_tenant


@pytest.fixture
def started(tmp_path, monkeypatch):
    """main() run up to the point it would serve: (the uvicorn config, the Gateway, the token written)."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    settings = {"http": "127.0.0.1:0", "max_message_bytes": 1000, "http_token_file": str(token),
                "http_dialect": "jevany", "http_cors_origins": "*"}
    listener = socket.create_server(("127.0.0.1", 0))
    seen = {}
    real_create_app = process.create_app

    def create_app(gateway):
        seen["gateway"] = gateway
        return real_create_app(gateway)

    monkeypatch.setattr(process, "create_app", create_app)
    monkeypatch.setattr(process, "configure_logging", lambda: None)      # the test run's logging stays
    monkeypatch.setattr(process._Server, "run", lambda server, sockets: seen.update(config=server.config))
    names = ("uvicorn.error", "uvicorn.access", "uvicorn")
    filters = {name: list(logging.getLogger(name).filters) for name in names}
    fd = os.dup(listener.fileno())      # main() takes it over as its listener, which closes it when let go
    listener.close()
    try:
        assert process.main(["--upstream", f"ipc://{tmp_path}/up.sock", "--fd", str(fd), "--settings",
                             json.dumps(settings), "--parent", str(os.getppid())]) == 0
        yield seen["config"], seen["gateway"]
    finally:
        for name, kept in filters.items():
            logging.getLogger(name).filters[:] = kept
        if "gateway" in seen:
            seen["gateway"].upstream.sock.close()
            seen["gateway"].upstream.ctx.term()


def test_the_buffers_budget_is_bodies_of_the_message_limit(started):
    assert GuardedHttp.buffers.budget == 1000 * BUFFER_BUDGET_MESSAGES


def test_the_token_is_the_file_s_line_and_the_tenant_its_salt(started):
    _, gateway = started
    assert gateway.token == "s3cret"
    assert gateway.upstream.prefix == [http_tenant("s3cret")] and gateway.upstream.max_message_bytes == 1000


def test_no_header_chooses_the_client_and_idle_connections_outlive_common_pools(started):
    config, _ = started
    assert config.proxy_headers is False and config.http is GuardedHttp
    assert config.timeout_keep_alive == process.KEEP_ALIVE_S > 60


def test_a_gateway_whose_supervisor_is_gone_stops():
    server = process._Server.__new__(process._Server)
    server.parent, server.floods, server.should_exit = os.getpid(), FloodFilter(1.0), False   # never its parent
    asyncio.run(asyncio.wait_for(server._watch_parent(), 10))      # bounded: a watch that never ends fails
    assert server.should_exit is True
