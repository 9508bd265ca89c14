"""The gateway process: uvicorn serving the routes on the listening socket the supervisor bound.

The supervisor binds the HTTP port itself and passes the socket down, so a
port clash is a start-up error it reports, and while a gateway is replaced
new connections wait in the socket's backlog instead of being refused.
uvicorn handles SIGTERM and SIGINT: it stops accepting, lets requests in
flight finish (bounded), then exits. If the supervisor dies, the gateway
notices its new parent and exits too.

Its settings come through an inherited descriptor (--settings-fd), not its
command line, which every local user can read. Connections are bounded by
connections.py, requests by guard.py (token, then body); uvicorn's warnings,
one per bad request, are rate-limited like the daemon's own events.
"""
import argparse
import asyncio
import logging
import os
import socket
import sys
from pathlib import Path

import uvicorn

from jevany_daemon.inherited_settings import read_settings
from jevany_daemon.logs import FloodFilter, configure_logging, event
from jevany_daemon.tenants import http_tenant

from .app import Gateway, create_app
from .connections import BUFFER_BUDGET_MESSAGES, Buffers, GuardedHttp
from .upstream import Upstream

log = logging.getLogger("jevany.gateway")
PARENT_CHECK_S = 1.0
GRACEFUL_STOP_S = 5
# Longer than the idle timeouts of common client pools and load balancers (60 s), so a
# connection is closed by the client that stopped using it, not under one about to send.
KEEP_ALIVE_S = 75
LOG_FLOOD_PERIOD_S = 10.0


class _Server(uvicorn.Server):
    """uvicorn, plus a check that the supervisor that started it is still there."""

    def __init__(self, config: uvicorn.Config, parent: int, floods: FloodFilter):
        super().__init__(config)
        self.parent, self.floods = parent, floods

    async def main_loop(self) -> None:
        watcher = asyncio.get_running_loop().create_task(self._watch_parent())
        try:
            await super().main_loop()
        finally:
            watcher.cancel()

    async def _watch_parent(self) -> None:
        while os.getppid() == self.parent:
            await asyncio.sleep(PARENT_CHECK_S)
            self.floods.flush()
        event(log, "gateway_exit", cause="supervisor gone")
        self.should_exit = True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="jevany-daemon HTTP gateway (started by the supervisor)")
    parser.add_argument("--upstream", required=True, help="the supervisor's private ipc endpoint")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, bound by the supervisor")
    parser.add_argument("--settings", default=None, help="ServeSettings as JSON")
    parser.add_argument("--settings-fd", type=int, default=None, help="a descriptor to read them from instead")
    parser.add_argument("--metrics-url", default=None)
    parser.add_argument("--uploads", default=None, help="where images sent in request bodies are written")
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    settings = read_settings(args.settings, args.settings_fd)
    configure_logging()
    token = None
    if settings.get("http_token_file"):
        token = Path(settings["http_token_file"]).read_text(encoding="utf-8").strip()
    listener = socket.socket(fileno=args.fd)
    upstream = Upstream(args.upstream, settings["max_message_bytes"], tenant=http_tenant(token))
    app = create_app(Gateway(upstream, settings, token, args.metrics_url, args.uploads))
    # No proxy headers: uvicorn trusts X-Forwarded-For from loopback by default, and there every local
    # user is a peer; the guard counts a client's bodies by its address, which a header must not choose.
    config = uvicorn.Config(app, http=GuardedHttp, log_level="warning", access_log=False, server_header=False,
                            timeout_graceful_shutdown=GRACEFUL_STOP_S, timeout_keep_alive=KEEP_ALIVE_S,
                            lifespan="on", backlog=2048, proxy_headers=False)
    GuardedHttp.buffers = Buffers(settings["max_message_bytes"] * BUFFER_BUDGET_MESSAGES)
    floods = FloodFilter(LOG_FLOOD_PERIOD_S)
    for name in ("uvicorn.error", "uvicorn.access", "uvicorn"):
        logging.getLogger(name).addFilter(floods)     # after Config, which sets uvicorn's loggers up
    event(log, "gateway_start", pid=os.getpid(), http=settings["http"], max_connections=GuardedHttp.limit,
          buffer_budget_bytes=GuardedHttp.buffers.budget)
    _Server(config, args.parent, floods).run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
