"""jevany-daemon: a decision model behind a ZeroMQ socket, batched by group commit."""

__version__ = "0.1.0"
