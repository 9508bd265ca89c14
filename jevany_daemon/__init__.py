"""jevany-daemon: a decision model behind a ZeroMQ socket, batched by group commit.

cli.py             jevany-daemon's commands: serve, tiny-model, keygen
config.py          the engine's and the loader's settings (EngineConfig, LoadOptions)
declaration.py     how a setting is declared, once, on its dataclass field
serve_options.py   serve's options, built from the settings' declarations
settings_table.py  the settings table of docs/SERVING.md, written from the declarations
inprocess.py       JevModel: the engine in this process
asgi.py            JevAny's HTTP API on a model in this process
parity.py          how far apart two sets of answers are
workloads.py       synthetic decide requests for tests, the demo and benchmarks
channel.py         the records the supervisor and its workers exchange, named once for both ends
logs.py            one key=value line per event, and rate-limited events, for every process
inherited_settings.py  settings to child processes through an inherited descriptor, not argv
tenants.py         whose requests may share the prefix cache: a salt from a key, a uid or a token
withdrawals.py     the gateway's word that an HTTP caller left before its answer, to the supervisor
http_options.py    the HTTP settings' words: the dialects, how CORS origins are written
server/            the supervisor process; server/settings.py holds the daemon's own settings
worker/            the worker process: the model, the engine's loop
engine/, model/, media/, gateway/, starter/  the engine, the weights, media, the HTTP gateway, the starter
"""

__version__ = "0.1.0"
