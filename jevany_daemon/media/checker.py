"""The media checker process: applies the media policy to one request at a time, for the supervisor.

Opening files with Pillow and PyAV is untrusted work: a hostile file can be
slow, or crash a decoder. So it runs here, in a process of its own, never on
the supervisor's loop and never in a worker holding the model. The supervisor
sends one request's media at a time, kills this process when a check runs
past its deadline, and starts another.

    supervisor → checker:  [tag, [[type, uri]...]]
    checker → supervisor:  [HELLO] once connected, then [tag, ok, [[type, path, stamp]...] or message]
                           (stamp: size, mtime, inode, so the worker can tell the file did not change)
"""
import argparse
import json
import os
import signal
import sys

import msgpack
import zmq

from jevany_client.errors import InvalidRequestError

from .policy import MediaPolicy, stamp

HELLO = "hello"
PARENT_CHECK_MS = 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="jevany-daemon media checker (started by the supervisor)")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--settings", required=True, help="ServeSettings as JSON")
    args = parser.parse_args(argv)
    # The supervisor stops this process; a Ctrl-C sent to the whole process group must not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    policy = MediaPolicy.from_settings(json.loads(args.settings))
    parent = os.getppid()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, args.identity.encode())
    sock.connect(args.endpoint)
    sock.send(msgpack.packb([HELLO]))
    try:
        while True:
            if not sock.poll(PARENT_CHECK_MS):
                if os.getppid() != parent:
                    return 0      # the supervisor is gone
                continue
            tag, items = msgpack.unpackb(sock.recv(), raw=False)
            sock.send(msgpack.packb([tag, *check(policy, items)]))
    finally:
        sock.close()
        ctx.term()


def check(policy: MediaPolicy, items) -> tuple[bool, object]:
    try:
        return True, [[kind, str(path), stamp(path)] for kind, path in policy.resolve(items)]
    except InvalidRequestError as exc:
        return False, exc.message
    except Exception:   # noqa: BLE001 - whatever a file did, the request gets a typed refusal
        return False, "media file could not be validated"


if __name__ == "__main__":
    sys.exit(main())
