"""Media requests, the half that needs no model: where a file may come from and what it may hold.

    policy.py   the media root, path rules and caps (JevAny's, with its messages), the uploads
                directory; no torch
    checks.py   checking each file's bytes with Pillow or PyAV for what they declare
    files.py    reading a file once, safely (no FIFO, no symlink, the file at the path checked), and
                its digest
    frames.py   a video's frames as its header declared them, or an error
    checker.py  the media checker process: the policy applied to one request at a time, for the
                supervisor

The other half, turning checked files into model inputs, is the model's
processor (jevany_daemon/model/). Neither runs on the supervisor's loop.
"""
