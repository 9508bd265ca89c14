"""The daemon: a supervisor process that owns the sockets and the queue, and worker processes that own the model.

supervisor.py  the one loop and its phases: receive → admit → dispatch → reply, signals, drain
client_ops.py  each client message: decoded, allowed or refused, its op run (decide, status, control ops)
worker_events.py  each worker message (hello, early answers, results, cleared, failed) and exit
lifecycle.py   what the loop runs on (one frozen Wiring), opened before its first turn and closed after its last
run_state.py   where the run stands (starting, ready, draining, drained), how it ends, who awaits "drained"
replies.py     each reply counted, logged where asked, and sent to whoever asked, a decide reply with the load
admission.py   the bounded request queue and deadlines
pool.py        every worker process, by generation (serving, incoming during a reload, retiring)
workers.py     one worker as the supervisor sees it: hand-over, heartbeat and batch deadlines, exit causes
devices.py     device names, counting GPUs without torch, which GPUs each worker is shown
worker.py      the worker process: load the model once, score what it is handed, heartbeat
reload.py      load a new generation beside the serving one, switch, retire the old
cache_clears.py  clear_cache across the pool: every worker empties its prefix cache, then one reply
channel.py     the supervisor ↔ worker message shapes
gateway.py     the HTTP gateway process (--http): its port, its private socket, restarts
media_checks.py  media requests on their way in: the media checker process checks their files first
sockets.py     binding client sockets: ipc safety, socket modes, CURVE on TCP, taking new peers or not
inbox.py       client messages in: a time budget a turn, each message bounded whole
outbox.py      replies out: only to the connection that asked, bounded in bytes for a client not reading
peers.py       connections as libzmq's monitor reports them: descriptors, idleness, credentials
fds.py         the descriptor limit raised, watched, and defended near its end
tenants.py     whose requests may share the prefix cache: a salt from a key, a uid or the HTTP token
handoff.py     settings to child processes through an inherited descriptor, not their command line
metrics_http.py  the metrics endpoint's server: one thread, few connections, deadlines
curve.py       CurveZMQ key files and the ZAP handler
sdnotify.py    systemd's notify protocol (READY, STATUS, WATCHDOG, STOPPING)
metrics.py     Prometheus metrics
signals.py     signal handlers that only set flags
status.py      live counters and figures behind the status op, from the parts they read; systemd's STATUS=
settings.py    flag > environment > TOML > default, validated before weights load
validation.py  the rules settings must meet, checked before any weights load
logs.py        one key=value line per event; rate-limited events

Nothing here but worker.py imports torch, so a CUDA fault cannot take the sockets down.
"""
