"""Which upstream or destination covers a (host, port) the proxy is asked to reach.

The proxy asks with the CONNECT (or absolute-form) host and port; the answer is a ``Route``:
the target, or the reason there is none. The reasons' values are the stable reason codes the
proxy answers with (``contract.errors.Reason`` has the same values):

* ``destination_ip_literal``: the host is an IP address (in any spelling);
* ``destination_not_allowed``: no destination or upstream names the host (also: not a DNS name);
* ``destination_port_not_allowed``: the host is named, the port is not.

Who owns a host: an exact name beats every wildcard; among wildcards, the longest suffix
(``*.a.example.com`` beats ``*.example.com``). Only the owner's ports count: a port the owning
entries do not name is refused even when a broader wildcard names it. Overlaps the loader
refuses (the same exact host and port twice; the same wildcard and port twice) never reach here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from policies.hosts import HostPattern, canonical_host, is_ip_literal

T = TypeVar("T")


class Miss(StrEnum):
    IP_LITERAL = "destination_ip_literal"
    NOT_ALLOWED = "destination_not_allowed"
    PORT_NOT_ALLOWED = "destination_port_not_allowed"


@dataclass(frozen=True)
class Entry(Generic[T]):
    pattern: HostPattern
    ports: frozenset[int]
    target: T


@dataclass(frozen=True)
class Route(Generic[T]):
    target: T | None
    miss: Miss | None = None
    host: str = ""  # the canonical host judged ("" when it was none)

    @property
    def found(self) -> bool:
        return self.target is not None


class DestinationIndex(Generic[T]):
    """Built once from every entry; ``route`` does no I/O and allocates little."""

    def __init__(self, entries: Iterable[Entry[T]]) -> None:
        self._exact: dict[str, list[Entry[T]]] = {}
        self._wild: dict[str, list[Entry[T]]] = {}
        for entry in entries:
            table = self._wild if entry.pattern.wildcard else self._exact
            table.setdefault(entry.pattern.suffix, []).append(entry)
        # longest suffix first: the most specific wildcard owns a host
        self._suffixes = sorted(self._wild, key=len, reverse=True)

    def route(self, host: str, port: int) -> Route[T]:
        if is_ip_literal(host):
            return Route(None, Miss.IP_LITERAL)
        name = canonical_host(host)
        if name is None:
            return Route(None, Miss.NOT_ALLOWED)
        owners = self._owners(name)
        if owners is None:
            return Route(None, Miss.NOT_ALLOWED, name)
        for entry in owners:
            if port in entry.ports:
                return Route(entry.target, None, name)
        return Route(None, Miss.PORT_NOT_ALLOWED, name)

    def _owners(self, name: str) -> list[Entry[T]] | None:
        exact = self._exact.get(name)
        if exact is not None:
            return exact
        for suffix in self._suffixes:
            if name.endswith("." + suffix):
                return self._wild[suffix]
        return None
