"""The daemon: a supervisor process that owns the sockets and the queue, and worker processes that own the model.

supervisor.py  the one loop: receive → admit → dispatch → reply, signals, drain
admission.py   the bounded request queue and deadlines
workers.py     spawning and watching worker processes; what each holds in flight
worker.py      the worker process: load the model once, score what it is handed
channel.py     the supervisor ↔ worker message shapes
status.py      live counters behind the status op
settings.py    flag > environment > TOML > default, validated before weights load

Nothing here but worker.py imports torch, so a CUDA fault cannot take the sockets down.
"""
