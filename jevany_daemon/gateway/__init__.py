"""The HTTP gateway: JevAny's routes outside, the ZeroMQ protocol inside.

A process of its own, started, watched and restarted by the supervisor like a
worker. It is one more client of the supervisor (over a private ipc socket),
so HTTP and ZeroMQ callers wait in the same queue and share batches, while
the supervisor never imports an HTTP stack.

    shapes.py       JevAny's request body as pydantic models (its 422s, our OpenAPI)
    upstream.py     one DEALER to the supervisor, many requests in flight over it
    departures.py   a caller that closes its connection while it waits: the wait ends, its request withdrawn
    replies.py      protocol error codes → HTTP status, headers and detail
    jevany_view.py  the /v1/models entry and the answer headers, in JevAny's shapes
    dialects.py     where JevAny's API and TypeSafe's Jev API differ: answer and error bodies (--http-dialect)
    decisions.py    OpenAI's Decisions API (POST /v1/decisions) as a decide request and back
    bulk.py         POST /v1/systemone/bulk: JSON lines in, each answer out as it finishes
    assets.py       images sent in a multipart body, kept in the uploads directory while checked
    paths.py        the paths the guard and the connection protocol treat apart
    encodings.py    compressed request bodies (zstd, gzip), decoded within --max-message-bytes
    app.py          the routes (CORS as JevAny's)
    guard.py        before the routes: the token from the headers, then the body's size and counts
    field_headers.py on every response: its request id, and Retry-After when busy (the Jev API's clients)
    connections.py  how many connections, for how long, with headers how big
    process.py      the process: uvicorn on the socket the supervisor bound
    embedded.py     the routes on a model in this process instead (jevany_daemon.asgi)
"""
