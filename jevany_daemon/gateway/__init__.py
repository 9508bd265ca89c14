"""The HTTP gateway: JevAny's routes outside, the ZeroMQ protocol inside.

A process of its own, started, watched and restarted by the supervisor like a
worker. It is one more client of the supervisor (over a private ipc socket),
so HTTP and ZeroMQ callers wait in the same queue and share batches, while
the supervisor never imports an HTTP stack.

    shapes.py       JevAny's request body as pydantic models (its 422s, our OpenAPI)
    upstream.py     one DEALER to the supervisor, many requests in flight over it
    replies.py      protocol error codes → HTTP status, headers and detail
    jevany_view.py  the /v1/models entry and the answer body, in JevAny's shapes
    app.py          the routes (CORS as JevAny's)
    guard.py        before the routes: the token from the headers, then the body's size and counts
    connections.py  how many connections, for how long, with headers how big
    process.py      the process: uvicorn on the socket the supervisor bound
    embedded.py     the routes on a model in this process instead (jevany_daemon.asgi)
"""
