"""An ASGI app served by a real uvicorn on a loopback socket, in a thread of the test process."""
import socket
import threading
from contextlib import contextmanager

import uvicorn

from .daemons import wait_for


@contextmanager
def serving(app):
    """Serve app (an ASGI app, or "module:attribute" as the uvicorn command takes it); yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        # started: the app's start-up (a model loading, for some) finished; a failed one ends the thread
        wait_for(lambda: server.started or not thread.is_alive(), 120, "uvicorn serving")
        assert server.started, "the app failed to start (see the log above)"
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        listener.close()
