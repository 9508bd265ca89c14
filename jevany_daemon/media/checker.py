"""The media checker process: applies the media policy to one request at a time, for the supervisor.

Opening files with Pillow and PyAV is untrusted work: a hostile file can be
slow, or crash a decoder. So it runs here, in a process of its own, never on
the supervisor's loop and never in a worker holding the model. The supervisor
sends one request's media at a time, kills this process when a check runs
past its deadline, and starts another.

    supervisor → checker:  [tag, [[type, uri]...]]
    checker → supervisor:  [HELLO] once connected, then [tag, ok, [[type, path, stamp]...] or message]
                           (stamp: the size and SHA-256 of the bytes checked, which the worker must read
                           again before it decodes them)
"""
import argparse
import os
import signal
import sys

import msgpack
import zmq

from jevany_client.errors import InvalidRequestError

from jevany_daemon.inherited_settings import read_settings

from .policy import MediaPolicy

HELLO = "hello"
PARENT_CHECK_MS = 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="jevany-daemon media checker (started by the supervisor)")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--settings", default=None, help="ServeSettings as JSON")
    parser.add_argument("--settings-fd", type=int, default=None, help="a descriptor to read them from instead")
    parser.add_argument("--uploads", default=None, help="the directory of images sent in request bodies")
    parser.add_argument("--parent", type=int, default=None,
                        help="the supervisor's pid (given, since it may die before this process asks)")
    args = parser.parse_args(argv)
    # The supervisor stops this process; a Ctrl-C sent to the whole process group must not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    policy = MediaPolicy.from_settings(read_settings(args.settings, args.settings_fd), uploads=args.uploads)
    parent = os.getppid() if args.parent is None else args.parent
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, args.identity.encode())
    # A DEALER with no peer blocks on send: bounded, so a checker whose supervisor died
    # mid-check goes on to notice it, instead of waiting forever to reply.
    sock.setsockopt(zmq.SNDTIMEO, PARENT_CHECK_MS)
    sock.connect(args.endpoint)
    try:
        if not reply(sock, [HELLO], parent):
            return 0
        while True:
            if not sock.poll(PARENT_CHECK_MS):
                if os.getppid() != parent:
                    return 0      # the supervisor is gone
                continue
            tag, items = msgpack.unpackb(sock.recv(), raw=False)
            if not reply(sock, [tag, *check(policy, items)], parent):
                return 0
    finally:
        sock.close()
        ctx.term()


def reply(sock, message: list, parent: int) -> bool:
    """Send, retrying while the supervisor lives; False once it is gone."""
    while True:
        try:
            sock.send(msgpack.packb(message))
            return True
        except zmq.Again:
            if os.getppid() != parent:
                return False


def check(policy: MediaPolicy, items) -> tuple[bool, object]:
    try:
        return True, [[kind, str(path), checked] for kind, path, checked in policy.check(items)]
    except InvalidRequestError as exc:
        return False, exc.message
    except Exception:   # noqa: BLE001 - whatever a file did, the request gets a typed refusal
        return False, "media file could not be validated"


if __name__ == "__main__":
    sys.exit(main())
