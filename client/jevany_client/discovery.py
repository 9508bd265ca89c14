"""`dns+tcp://` endpoints: a set of daemons named by DNS, resolved again every few seconds.

    dns+tcp://NAME:PORT   every A and AAAA record of NAME, each as tcp://ADDRESS:PORT
                          (a Kubernetes headless Service lists its ready pods so);
    dns+tcp://NAME        the SRV records of NAME (_zmq._tcp.jevany.NS.svc.cluster.local),
                          each as tcp://TARGET:PORT: a StatefulSet's pods by their stable
                          names, so the affinity ring keeps its shape when a pod moves.

Addresses are looked up as the system does (getaddrinfo: hosts file, search
domains); SRV records through dnspython with the system's resolver settings.
JEVANY_DNS_SERVER=HOST:PORT sends every lookup to that DNS server instead
(dnspython), for a resolver the system is not configured with.
"""

import ipaddress
import os
import socket
from dataclasses import dataclass

SCHEME = "dns+tcp://"
DNS_SERVER_ENV = "JEVANY_DNS_SERVER"
LOOKUP_TIMEOUT_S = 2.0


class DiscoveryError(Exception):
    """A name that could not be resolved this time; the members found before are kept."""


@dataclass(frozen=True)
class Named:
    name: str
    port: int | None       # None: SRV records give the ports

    @property
    def endpoint(self) -> str:
        return f"{SCHEME}{self.name}" + ("" if self.port is None else f":{self.port}")


def is_discovered(endpoint: str) -> bool:
    return endpoint.startswith(SCHEME)


def parse(endpoint: str) -> Named:
    rest = endpoint[len(SCHEME):]
    name, sep, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not sep:
        name, port = rest, None
    if not name or "/" in name or (port is not None and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"a discovered endpoint is dns+tcp://NAME:PORT or dns+tcp://NAME (SRV), got {endpoint!r}")
    return Named(name, None if port is None else int(port))


def resolve(named: Named) -> list[str]:
    """The tcp:// endpoints NAME stands for now, sorted; DiscoveryError when the lookup fails."""
    server = os.environ.get(DNS_SERVER_ENV)
    if named.port is None:
        return sorted(f"tcp://{target}:{port}" for target, port in _srv(named.name, server))
    addresses = _dns_addresses(named.name, server) if server else _system_addresses(named.name, named.port)
    return sorted({tcp_endpoint(address, named.port) for address in addresses})


def tcp_endpoint(address: str, port: int) -> str:
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"


def is_ipv6(endpoint: str) -> bool:
    host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _system_addresses(name: str, port: int) -> set[str]:
    try:
        found = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DiscoveryError(f"{name}: {exc.strerror or exc}") from None
    return {info[4][0] for info in found if info[0] in (socket.AF_INET, socket.AF_INET6)}


def _resolver(server: str | None):
    import dns.resolver     # only where SRV records or a named DNS server are used

    if server is None:
        resolver = dns.resolver.Resolver()
    else:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise DiscoveryError(f"{DNS_SERVER_ENV} must be HOST:PORT, got {server!r}")
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port = [host.strip("[]")], int(port)
    resolver.lifetime = LOOKUP_TIMEOUT_S
    return resolver


def _query(resolver, name: str, kind: str) -> list:
    import dns.exception
    import dns.resolver

    try:
        return list(resolver.resolve(name, kind, search=True))
    except (dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
        return []
    except dns.exception.DNSException as exc:
        raise DiscoveryError(f"{name} ({kind}): {exc}") from None


def _dns_addresses(name: str, server: str) -> set[str]:
    resolver = _resolver(server)
    found = {r.address for kind in ("A", "AAAA") for r in _query(resolver, name, kind)}
    if not found:
        raise DiscoveryError(f"{name}: no A or AAAA records")
    return found


def _srv(name: str, server: str | None) -> set[tuple[str, int]]:
    records = _query(_resolver(server), name, "SRV")
    if not records:
        raise DiscoveryError(f"{name}: no SRV records")
    return {(r.target.to_text(omit_final_dot=True), r.port) for r in records}
