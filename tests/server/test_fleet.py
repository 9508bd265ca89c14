"""One client over several daemons: a daemon killed with requests in hand costs the client none of them."""
import os
import signal
import threading
import time

from jevany_client import JevClient
from jevany_daemon import workloads

from .daemons import wait_for


def test_a_daemon_killed_holding_requests_is_ridden_over_by_the_other(start_daemon):
    a, b = start_daemon(ready=False), start_daemon(ready=False)
    a.wait_ready()
    b.wait_ready()
    [a_worker] = a.workers()
    os.kill(a_worker["pid"], signal.SIGSTOP)      # whatever reaches a now stays there
    bodies = workloads.short(20, seed=31)
    killed = threading.Event()

    def kill_a_once_it_holds_work():
        wait_for(lambda: a.status()["workers"][0]["inflight"] + a.status()["queue"]["depth"] > 0, 60,
                 "requests held by the frozen daemon")
        os.kill(a_worker["pid"], signal.SIGKILL)
        a.proc.kill()
        killed.set()

    def pinged(daemon) -> int:
        return daemon.status()["requests"]["by_op"].get("ping", 0)

    with JevClient([a.endpoint, b.endpoint], timeout=60, retries=2) as client:
        # Requests go only to connected daemons; start once both have been reached.
        wait_for(lambda: client.ping() and pinged(a) and pinged(b), 30, "both daemons connected")
        killer = threading.Thread(target=kill_a_once_it_holds_work)
        killer.start()
        started = time.monotonic()
        results = client.decide_many(bodies)
        killer.join()
    assert killed.is_set()
    assert [set(r["answers"]) for r in results] == [set(body["questions"]) for body in bodies]
    assert time.monotonic() - started < 30          # resent on the disconnect, not after a timeout
    assert b.status()["batching"]["requests"] >= len(bodies)
    assert b.stop() == 0
