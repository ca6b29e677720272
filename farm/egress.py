"""Where an endpoint job may connect: the operator's egress policy, after OWASP's SSRF prevention (an allowlist; the
name resolved once, every address it resolves to checked, and the job's connections pinned to the one checked).

A request's endpoint (``--endpoint``) names a server the worker connects to. Without a policy a submitter could
point a worker at its cloud's metadata service, the broker or the database, or a service on the worker's own
loopback. ``FARM_ENDPOINT_ALLOW`` lists what jobs may reach, comma- or space-separated:

- ``*``: any address the denials below leave;
- ``HOST`` or ``HOST:PORT`` (``[V6]:PORT``): a name or address, any port or that port;
- ``CIDR`` or ``CIDR:PORT`` (``10.0.0.0/8:8000``, ``[fd00::/8]:8000``): an address range.

Always refused, whatever the list says: link-local and cloud metadata addresses (``169.254.0.0/16``, ``fe80::/10``,
``fd00:ec2::254``, ``100.100.100.200``), unspecified, multicast and reserved addresses, the broker's and the
database's ``HOST:PORT`` (``FARM_BROKER_URL``, ``FARM_DATABASE_URL``) and the worker's own metrics ports on its own
addresses. Loopback and the broker's and database's hosts (other ports) are refused unless an entry names them
exactly (``127.0.0.1:8000``, ``localhost``), not through ``*`` or a range; in the embedded default (no broker, no
list) loopback and every other address the denials leave are allowed: the submitter is the operator there. On a
cluster without a list, no endpoint is allowed.

:func:`pin` checks an endpoint and returns the address to connect to; it never opens a connection, so a refused
endpoint gets none. :func:`check_load` caps an endpoint job's rate and requests in flight
(``FARM_ENDPOINT_MAX_RATE``, ``FARM_ENDPOINT_MAX_IN_FLIGHT``): a worker must not become a traffic amplifier.
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import psutil
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from farm.errors import EgressError
from farm.settings import get_settings

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
#: cloud metadata services (AWS/GCP/Azure/OpenStack at 169.254.169.254, AWS's IPv6 one, Alibaba's)
METADATA = tuple(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200"))
#: ports after FARM_METRICS_PORT a worker's slots may listen on (slot i: port + i)
METRICS_PORT_SPAN = 64
HINT = "the workers' operator lists the endpoints jobs may reach in FARM_ENDPOINT_ALLOW (docs/security.md)"
DEFAULT_PORTS = {"postgresql": 5432, "postgres": 5432, "redis": 6379, "rediss": 6379, "mysql": 3306, "amqp": 5672}


@dataclass(frozen=True)
class Rule:
    """One allowlist entry: a name (``host``), an address range (``net``) or any (``*``), with a port or any."""

    text: str
    host: str | None = None
    net: IpNetwork | None = None
    port: int | None = None

    @property
    def exact(self) -> bool:
        """Whether the entry names one host or address (it may then allow loopback and the broker's host)."""
        return self.host is not None or (self.net is not None and self.net.num_addresses == 1)

    def matches(self, name: str, address: IpAddress, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.host is not None:
            return self.host in (name.lower(), str(address))
        return self.net is None or address in self.net


@dataclass(frozen=True)
class Pinned:
    """An endpoint checked by the policy: the name it was given (``host``, no brackets), its ``port`` and the
    ``address`` every connection of the job goes to."""

    host: str
    port: int
    address: str

    @property
    def hostport(self) -> str:
        """Where to connect: ``ADDRESS:PORT`` (``[V6]:PORT``)."""
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"

    @property
    def authority(self) -> str:
        """The endpoint as the request named it, ``HOST:PORT``: the HTTP ``Host`` header and the TLS name."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def split_hostport(text: str) -> tuple[str, int | None]:
    """``HOST``, ``HOST:PORT``, ``[V6]`` or ``[V6]:PORT`` as (host, port or None); ValueError otherwise."""
    t = text.strip()
    if t.startswith("["):
        host, _, rest = t[1:].partition("]")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"{text!r} is not [ADDRESS]:PORT")
        return host, _port(rest[1:], text)
    if t.count(":") == 1:
        host, _, port = t.partition(":")
        return host, _port(port, text)
    return t, None


def _port(text: str, whole: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{whole!r} has no port from 1 to 65535")
    return int(text)


def parse_allow(text: str | None) -> list[Rule]:
    """The rules of a ``FARM_ENDPOINT_ALLOW`` value; EgressError naming a bad entry."""
    rules = []
    for item in filter(None, (p.strip() for p in (text or "").replace(",", " ").split())):
        try:
            rules.append(_rule(item))
        except ValueError as exc:
            raise EgressError(f"FARM_ENDPOINT_ALLOW: {exc}; give HOST, HOST:PORT, CIDR, CIDR:PORT or *") from None
    return rules


def _rule(item: str) -> Rule:
    if item == "*":
        return Rule(item)
    host, port = split_hostport(item)
    if "/" in host:
        return Rule(item, net=ipaddress.ip_network(host, strict=False), port=port)
    if not host:
        raise ValueError(f"{item!r} names no host")
    try:
        return Rule(item, net=ipaddress.ip_network(host), port=port)
    except ValueError:
        return Rule(item, host=host.lower().rstrip("."), port=port)


def _always_denied(address: IpAddress) -> str | None:
    """Why ``address`` is refused whatever the allowlist says (None: it is not)."""
    if address in METADATA:
        return "a cloud metadata address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_unspecified or address.is_multicast or address.is_reserved:
        return "not a host address"
    return None


def _url_hostport(url: str | None) -> tuple[str, int] | None:
    if not url:
        return None
    try:
        u = make_url(url)
    except ArgumentError:
        return None
    if not u.host:
        return None
    return u.host, u.port or DEFAULT_PORTS.get(u.get_backend_name(), 0)


@lru_cache(maxsize=16)
def _resolve(host: str, port: int) -> tuple[IpAddress, ...]:
    """Every address ``host`` resolves to (an address literal: itself); () when it does not resolve."""
    try:
        return (_plain(ipaddress.ip_address(host)),)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    return tuple(dict.fromkeys(_plain(ipaddress.ip_address(str(i[4][0]).split("%")[0])) for i in infos))


def _plain(address: IpAddress) -> IpAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it reaches (``::ffff:127.0.0.1`` is loopback)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def farm_services() -> list[tuple[set[IpAddress], int, str]]:
    """The broker's and the database's addresses with their ports, named (what endpoint jobs never reach)."""
    s = get_settings()
    out = []
    for what, url in (("the broker", s.broker_url), ("the database", s.database_url)):
        hp = _url_hostport(url)
        if hp is not None:
            out.append((set(_resolve(*hp)), hp[1], what))
    return out


def local_addresses() -> set[IpAddress]:
    """This host's own addresses (every interface's, loopback included)."""
    out: set[IpAddress] = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    out.add(ipaddress.ip_address(a.address.split("%")[0]))
                except ValueError:
                    continue
    return out


def _own_port(address: IpAddress, port: int) -> bool:
    mp = get_settings().metrics_port
    if not mp or not mp <= port < mp + METRICS_PORT_SPAN:
        return False
    return address.is_loopback or address in local_addresses()


def why_refused(name: str, address: IpAddress, port: int, rules: Iterable[Rule] | None = None) -> str | None:
    """Why a connection to ``address``:``port`` (resolved from ``name``) is refused by this host's policy; None when
    it is allowed."""
    why = _always_denied(address)
    if why is not None:
        return why
    if _own_port(address, port):
        return "a port of this worker's own (its metrics endpoint)"
    services = farm_services()
    for addresses, service_port, what in services:
        if address in addresses and port == service_port:
            return f"{what}'s address"
    settings = get_settings()
    rules = list(parse_allow(settings.endpoint_allow) if rules is None else rules)
    matching = [r for r in rules if r.matches(name, address, port)]
    special = ("loopback" if address.is_loopback else
               next((f"{what}'s host" for addresses, _, what in services if address in addresses), None))
    if not rules:
        if settings.embedded:
            return None
        return "not in FARM_ENDPOINT_ALLOW, which is not set: a cluster's workers reach no endpoint until it is"
    if special is not None and not any(r.exact for r in matching):
        return f"{special}, which only an entry naming it exactly allows"
    return None if matching else "not in FARM_ENDPOINT_ALLOW"


def pin(endpoint: str, rules: Iterable[Rule] | None = None) -> Pinned:
    """Check ``endpoint`` (``HOST:PORT``) against this host's policy, resolving its name once, and return the address
    to connect to; EgressError (one line, before any connection) when it resolves to nothing or to any refused
    address."""
    try:
        host, port = split_hostport(endpoint)
    except ValueError as exc:
        raise EgressError(f"endpoint {endpoint!r}: {exc}") from None
    if port is None:
        raise EgressError(f"endpoint {endpoint!r} has no port; give HOST:PORT")
    name = host.lower().rstrip(".")
    _resolve.cache_clear()  # once per check: a name's addresses may change between jobs, not within one
    addresses = _resolve(name, port)
    if not addresses:
        raise EgressError(f"endpoint {endpoint}: {host} does not resolve on this host; check the name")
    rule_list = None if rules is None else list(rules)
    for address in addresses:
        why = why_refused(name, address, port, rule_list)
        if why is not None:
            shown = f"{address}" if str(address) == name else f"{name} ({address})"
            raise EgressError(f"endpoint {endpoint} refused: {shown} is {why}; {HINT}")
    return Pinned(host=host, port=port, address=str(addresses[0]))


def check_load(concurrency: Iterable[int], rates: Iterable[float | None]) -> None:
    """EgressError (one line) when an endpoint job would keep more requests in flight or send faster than this
    host's caps allow (``FARM_ENDPOINT_MAX_IN_FLIGHT``, ``FARM_ENDPOINT_MAX_RATE``)."""
    s = get_settings()
    top_c = max(concurrency, default=0)
    if top_c > s.endpoint_max_in_flight:
        raise EgressError(f"concurrency {top_c} is above the {s.endpoint_max_in_flight} requests an endpoint job may "
                          "keep in flight (FARM_ENDPOINT_MAX_IN_FLIGHT); lower --concurrency")
    top_r = max((r for r in rates if r is not None), default=None)
    if top_r is not None and top_r > s.endpoint_max_rate:
        raise EgressError(f"rate {top_r:g}/s is above the {s.endpoint_max_rate:g} requests/s an endpoint job may send "
                          "(FARM_ENDPOINT_MAX_RATE); lower --rate (a trace: --trace-speed)")
