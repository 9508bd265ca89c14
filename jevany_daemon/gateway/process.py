"""The gateway process: uvicorn serving the routes on the listening socket the supervisor bound.

The supervisor binds the HTTP port itself and passes the socket down, so a
port clash is a start-up error it reports, and while a gateway is replaced
new connections wait in the socket's backlog instead of being refused.
uvicorn handles SIGTERM and SIGINT: it stops accepting, lets requests in
flight finish (bounded), then exits. If the supervisor dies, the gateway
notices its new parent and exits too.
"""
import argparse
import asyncio
import json
import logging
import os
import socket
import sys
from pathlib import Path

import uvicorn

from jevany_daemon.server.logs import configure_logging, event

from .app import Gateway, create_app
from .upstream import Upstream

log = logging.getLogger("jevany.gateway")
PARENT_CHECK_S = 1.0
GRACEFUL_STOP_S = 5
# Longer than the idle timeouts of common client pools and load balancers (60 s), so a
# connection is closed by the client that stopped using it, not under one about to send.
KEEP_ALIVE_S = 75


class _Server(uvicorn.Server):
    """uvicorn, plus a check that the supervisor that started it is still there."""

    def __init__(self, config: uvicorn.Config, parent: int):
        super().__init__(config)
        self.parent = parent

    async def main_loop(self) -> None:
        watcher = asyncio.get_running_loop().create_task(self._watch_parent())
        try:
            await super().main_loop()
        finally:
            watcher.cancel()

    async def _watch_parent(self) -> None:
        while os.getppid() == self.parent:
            await asyncio.sleep(PARENT_CHECK_S)
        event(log, "gateway_exit", cause="supervisor gone")
        self.should_exit = True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="jevany-daemon HTTP gateway (started by the supervisor)")
    parser.add_argument("--upstream", required=True, help="the supervisor's private ipc endpoint")
    parser.add_argument("--fd", type=int, required=True, help="the listening socket, bound by the supervisor")
    parser.add_argument("--settings", required=True, help="ServeSettings as JSON")
    parser.add_argument("--metrics-url", default=None)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    settings = json.loads(args.settings)
    configure_logging()
    token = None
    if settings.get("http_token_file"):
        token = Path(settings["http_token_file"]).read_text(encoding="utf-8").strip()
    listener = socket.socket(fileno=args.fd)
    upstream = Upstream(args.upstream, settings["max_message_bytes"])
    app = create_app(Gateway(upstream, settings, token, args.metrics_url))
    config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                            timeout_graceful_shutdown=GRACEFUL_STOP_S, timeout_keep_alive=KEEP_ALIVE_S,
                            lifespan="on", backlog=2048)
    event(log, "gateway_start", pid=os.getpid(), http=settings["http"])
    _Server(config, args.parent).run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
