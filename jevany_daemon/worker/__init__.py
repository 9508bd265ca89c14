"""The worker process: it holds the model, and only it imports torch.

The supervisor starts each worker as ``python -m jevany_daemon.worker`` and
sees it through server/worker_handle.py; the two talk over a private ipc
socket in the records of jevany_daemon/channel.py. Nothing here imports the
supervisor's side.

process.py  the process: settings read from an inherited descriptor, the model loaded once,
            warmed, then the loop; heartbeats, exit codes
loop.py     its one loop: receive, admit, launch, collect, answer, a pass on the device while
            the host works around it
collector.py  Python's cyclic collector as the worker sees it: collections and their time
"""
