"""Media requests, the half that needs no model: where a file may come from and what it may hold.

    policy.py   the media root, path rules and caps (JevAny's, with its messages); no torch
    checks.py   opening each file with Pillow or PyAV to check what it declares

The other half, turning checked files into model inputs, is the model's
processor (jevany_daemon/model/). Neither runs on the supervisor's loop.
"""
