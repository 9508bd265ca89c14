"""The supervisor process: it owns the sockets, the queue and the worker processes (jevany_daemon/worker/).

supervisor.py  the one loop and its phases: receive → admit → dispatch → reply, signals, drain
client_ops.py  each client message: decoded, allowed or refused, its op run (decide, status, control ops)
worker_events.py  each worker message (hello, early answers, results, cleared, failed) and exit
lifecycle.py   what the loop runs on (one frozen Wiring), opened before its first turn and closed after its last
run_state.py   where the run stands (starting, ready, draining, drained), how it ends, who awaits "drained"
replies.py     each reply counted, logged where asked, and sent to whoever asked, a decide reply with the load
request_queue.py  the bounded request queue and deadlines
gather.py      GPU-aware group commit: when a free worker waits for clients just answered
pace.py        each worker's pace against its own best: a worker slowing down by itself, said and replaced
pool.py        every worker process, by generation (serving, incoming during a reload, retiring)
worker_handle.py  one worker as the supervisor sees it: hand-over, heartbeat and batch deadlines, exit causes
device_names.py  device names, counting GPUs without torch, which GPUs each worker is shown
reload.py      load a new generation beside the serving one, switch, retire the old
cache_clears.py  clear_cache across the pool: every worker empties its prefix cache, then one reply
gateway_handle.py  the HTTP gateway process (--http) as the supervisor sees it: its port, its socket, restarts
media_checks.py  media requests on their way in: the media checker process checks their files first
sockets.py     binding client sockets: ipc safety, socket modes, CURVE on TCP, taking new peers or not
inbox.py       client messages in: a time budget a turn, each message bounded whole
outbox.py      replies out: only to the connection that asked, bounded in bytes for a client not reading
peers.py       connections as libzmq's monitor reports them: descriptors, idleness, credentials
fds.py         the descriptor limit raised, watched, and defended near its end
metrics_http.py  the metrics endpoint's server: one thread, few connections, deadlines
curve.py       CurveZMQ key files and the ZAP handler
sdnotify.py    systemd's notify protocol (READY, STATUS, WATCHDOG, STOPPING)
metrics.py     Prometheus metrics
signals.py     signal handlers that only set flags
status.py      live counters and figures behind the status op, from the parts they read; systemd's STATUS=
settings.py    flag > environment > TOML > default, validated before weights load
validation.py  the rules settings must meet, checked before any weights load
jevany_options.py  JevAny's serve options and variables: taken where they mean ours, else refused

Nothing here imports torch, so a CUDA fault cannot take the sockets down. What both sides
share is in jevany_daemon/: the supervisor ↔ worker records (channel.py), logs.py, the
settings handed to child processes (inherited_settings.py), tenants.py and the gateway's
withdrawals (withdrawals.py).
"""
