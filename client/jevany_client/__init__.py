"""jevany-client: the wire protocol, request schema and client for jevany-daemon. No torch."""
