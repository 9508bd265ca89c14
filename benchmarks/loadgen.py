"""One benchmark client process: jevany-client only, no torch, like the fleet it stands for.

bench.py starts a pool of these as plain subprocesses (not multiprocessing
spawn, which would re-import bench.py and with it torch into every client)
and steers each over the connection whose file descriptor it is given:

    → (endpoint, [body...])   connect, ping, reply "ready"
    → "go"                    send the bodies one after another, each after the last reply
    ← [seconds...]            each request's latency, in order
    → None                    exit
"""
import sys
import time
from multiprocessing.connection import Connection

from jevany_client import JevClient


def main(fd: int) -> None:
    conn = Connection(fd)
    conn.send("started")
    while True:
        task = conn.recv()
        if task is None:
            return
        endpoint, bodies = task
        with JevClient(endpoint, timeout=600, retries=0) as client:
            client.ping()                    # connected before the clock starts
            conn.send("ready")
            conn.recv()                      # go
            latencies = []
            for body in bodies:
                started = time.perf_counter()
                client.call("decide", body)
                latencies.append(time.perf_counter() - started)
        conn.send(latencies)


if __name__ == "__main__":
    main(int(sys.argv[1]))
