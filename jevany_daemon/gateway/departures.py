"""An HTTP caller that closes its connection while its request waits on the daemon: the wait ends there.

uvicorn does not stop a route whose caller has gone; it only has the route's
next receive() return http.disconnect. So while a route waits on the daemon,
a watcher awaits that receive (the body has been read by then: nothing else
can come) and, when the caller goes, cancels the wait. The upstream call,
cancelled, withdraws its request (upstream.py), and the supervisor drops it
if still queued: a departed caller costs no forward pass.
"""
import asyncio


class CallerGone(Exception):
    """The HTTP caller closed its connection before its answer came."""


async def while_connected(receive, call):
    """call's outcome; CallerGone, with call cancelled, if the caller goes first."""
    route = asyncio.current_task()
    waiting, ours = True, False

    def gone(watcher: asyncio.Task) -> None:
        nonlocal ours
        # A callback runs on a later turn of the loop: by then the route may be past its wait.
        if waiting and not watcher.cancelled():
            ours = True
            route.cancel()

    watcher = asyncio.ensure_future(_disconnected(receive))
    watcher.add_done_callback(gone)
    try:
        return await call
    except asyncio.CancelledError:
        # Our cancel alone: the route answers, to nobody, rather than being torn down. One from
        # elsewhere too (the server stopping) still ends the route.
        if ours and route.uncancel() == 0:
            raise CallerGone() from None
        raise
    finally:
        waiting = False
        watcher.cancel()


async def _disconnected(receive) -> None:
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:       # a connection that cannot be read from has no caller left to answer
        return
