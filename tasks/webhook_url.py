"""Webhook URL checking for ``http.post``: one parse, one resolution, one address.

Two URL parsers that disagree are an SSRF: ``http://127.0.0.1:41065\\@localhost/``
is host ``localhost`` to ``urllib.parse`` and ``127.0.0.1:41065`` to urllib3.
So a webhook URL is parsed once, by urllib3 (the parser that sends), anything
the parsers could read differently is refused outright (backslashes, userinfo,
percent-encoded or non-ASCII hosts, whitespace, control characters, odd IPv4
spellings), the host and port must be named by the allow-list, and the host is
resolved once: every address must be public unless the allow-list names it
(or the host is ``localhost``), and the request goes to that checked address.

Allow-list entries (``DISPATCH_WEBHOOK_ALLOWED_HOSTS``): ``host`` (default port
of the scheme only: 80 / 443), ``host:port``, or ``host:*`` (any port); IPv6
as ``[::1]:port``. Pure logic: no Django import; the resolver is a parameter.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
#: Longest URL accepted, in characters.
MAX_URL_LEN = 2048
_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_ANY_PORT = "*"

Resolver = Callable[..., list]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookURLError(ValueError):
    """The webhook URL is refused; the message says why (with the URL redacted)."""


@dataclass(frozen=True)
class AllowEntry:
    host: str
    port: int | str | None  # None: the scheme's default port; "*": any port


@dataclass(frozen=True)
class WebhookTarget:
    """A checked URL: send ``request_uri`` to ``host``:``port`` (with ``Host: host_header``)."""

    scheme: str
    host: str  # lower case; IPv6 without brackets
    port: int
    request_uri: str
    url: str  # the normalised URL (as urllib3 renders it)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


def redact_url(url: object) -> str:
    """``url`` fit for an error message or a log: no userinfo, no query values, no fragment.

    Works on any text (also URLs the checker refused): everything before the
    last ``@`` of the authority (up to the first ``/`` or ``?``) is hidden.
    """
    text = str(url).split("#", 1)[0]
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    authority, tail = re.match(r"([^/?]*)(.*)", rest, re.S).groups()  # type: ignore[union-attr]  # always matches
    if "@" in authority:  # userinfo, also the part past a backslash that parsers read differently
        authority = "***@" + authority.rsplit("@", 1)[1]
    path, qsep, query = tail.partition("?")
    if qsep:
        parts = [p.split("=", 1)[0] + ("=***" if "=" in p else "") for p in query.split("&")]
        path = f"{path}?{'&'.join(parts)}"
    return f"{scheme}{sep}{authority}{path}"


def parse_allow_list(entries: Iterable[str]) -> list[AllowEntry]:
    """Entries of ``DISPATCH_WEBHOOK_ALLOWED_HOSTS``; a malformed one raises ValueError naming it."""
    parsed = []
    for raw in entries:
        entry = raw.strip().lower()
        if not entry:
            continue
        match = re.fullmatch(r"(\[[0-9a-f:.]+\]|[^:\[\]]+)(?::(\d{1,5}|\*))?", entry)
        if not match:
            raise ValueError(f"DISPATCH_WEBHOOK_ALLOWED_HOSTS entry {raw!r} is not host, host:port or host:*")
        host, port = match.group(1).strip("[]"), match.group(2)
        if port is None:
            parsed.append(AllowEntry(host, None))
        elif port == _ANY_PORT:
            parsed.append(AllowEntry(host, _ANY_PORT))
        elif 0 < int(port) < 65536:
            parsed.append(AllowEntry(host, int(port)))
        else:
            raise ValueError(f"DISPATCH_WEBHOOK_ALLOWED_HOSTS entry {raw!r} has a port out of range")
    return parsed


def _allows(entry: AllowEntry, host: str, port: int, scheme: str) -> bool:
    if entry.host != host:
        return False
    return entry.port == _ANY_PORT or entry.port == port or (entry.port is None and port == DEFAULT_PORTS[scheme])


def _check_host(host: str, shown: str) -> str:
    """The host as sent, lower case (IPv6 without brackets); refuse spellings parsers read differently."""
    if host.startswith("["):
        try:
            return str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise WebhookURLError(f"options.url {shown!r}: {host!r} is not an IPv6 address") from None
    if re.fullmatch(r"[0-9.]+", host):
        try:
            address = ipaddress.IPv4Address(host)
        except ValueError:
            address = None
        if address is None or str(address) != host:
            raise WebhookURLError(f"options.url {shown!r}: write the IPv4 address {host!r} as four decimal "
                                  "numbers (a.b.c.d)")
        return host
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.match(label) for label in labels):
        raise WebhookURLError(f"options.url {shown!r}: host {host!r} is not a plain DNS name (letters, digits, "
                              "hyphens; no trailing dot; write internationalised names in punycode)")
    if labels[-1].isdigit() or re.fullmatch(r"0x[0-9a-f]*", labels[-1]):
        raise WebhookURLError(f"options.url {shown!r}: host {host!r} looks like a numeric address; "
                              "write it as a.b.c.d")
    return host


def parse_webhook_url(url: object, allow_list: Iterable[str]) -> WebhookTarget:
    """Check ``url`` without resolving it; raise WebhookURLError naming what is wrong."""
    if not isinstance(url, str) or not url:
        raise WebhookURLError("options.url is required (an http:// or https:// URL)")
    shown = redact_url(url)[:200]
    if len(url) > MAX_URL_LEN:
        raise WebhookURLError(f"options.url is longer than {MAX_URL_LEN} characters")
    for char in url:
        if char == "\\" or not " " < char < "\x7f":
            raise WebhookURLError(f"options.url {shown!r} contains {char!r}: only printable ASCII without "
                                  "spaces or backslashes is accepted")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in DEFAULT_PORTS:
        raise WebhookURLError(f"options.url {shown!r} must be an http:// or https:// URL with a host")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        raise WebhookURLError(f"options.url {shown!r} carries credentials (user:password@): put them in "
                              "options.headers (e.g. Authorization) instead")
    if "%" in authority:
        raise WebhookURLError(f"options.url {shown!r}: percent-encoding is not allowed in the host")
    # inner import: urllib3 (with ssl and http.client) is 0.05 s of a process's start; only a webhook's check uses it
    from urllib3.exceptions import LocationParseError
    from urllib3.util import parse_url

    try:
        parsed = parse_url(url)
        other = urlsplit(url)
        other_port = other.port
    except (LocationParseError, ValueError) as exc:
        raise WebhookURLError(f"options.url {shown!r} cannot be parsed: {exc}") from None
    if not parsed.host or parsed.auth is not None or other.username is not None:
        raise WebhookURLError(f"options.url {shown!r} must be an http:// or https:// URL with a host")
    scheme = parsed.scheme or ""
    host = _check_host(parsed.host, shown)
    port = parsed.port if parsed.port is not None else DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        raise WebhookURLError(f"options.url {shown!r}: port {port} is out of range")
    # Belt and braces: the standard library must read the same host and port.
    other_host = (other.hostname or "").lower()
    if other_host != host or (other_port if other_port is not None else DEFAULT_PORTS[scheme]) != port:
        raise WebhookURLError(f"options.url {shown!r} is ambiguous (URL parsers disagree on its host or port)")
    entries = parse_allow_list(allow_list)
    if not any(_allows(entry, host, port, scheme) for entry in entries):
        named = ", ".join((f"[{e.host}]" if ":" in e.host else e.host) + ("" if e.port is None else f":{e.port}")
                          for e in entries) or "(none)"
        where = host if port == DEFAULT_PORTS[scheme] else f"{host}:{port}"
        raise WebhookURLError(f"options.url host '{where}' is not allowed; allowed hosts: {named} (setting "
                              "DISPATCH_WEBHOOK_ALLOWED_HOSTS; name a non-default port as host:port)")
    request_uri = parsed.request_uri
    normalised = parsed._replace(host=f"[{host}]" if ":" in host else host, fragment=None,
                                 port=None if port == DEFAULT_PORTS[scheme] else port)
    return WebhookTarget(scheme=scheme, host=host, port=port, request_uri=request_uri, url=normalised.url)


def _is_public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not (
        address.is_private or address.is_loopback or address.is_link_local or address.is_multicast
        or address.is_reserved or address.is_unspecified
    )


def pin_addresses(target: WebhookTarget, allow_list: Iterable[str], resolve: Resolver | None = None) -> list[str]:
    """Resolve ``target.host`` once; return the checked addresses to connect to, or raise WebhookURLError.

    Every address the name resolves to must be public, unless the allow-list
    names that address itself on the target's port (``127.0.0.1:9000`` exempts
    127.0.0.1 on port 9000 only, ``127.0.0.1`` on the scheme's default port) or
    the host is ``localhost`` and the address is loopback: a public name cannot
    be pointed at the metadata service or the admin's loopback ports.
    """
    entries = parse_allow_list(allow_list)
    resolve = resolve or socket.getaddrinfo  # looked up per call, so a test can stand in for DNS
    try:
        infos = resolve(target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise WebhookURLError(f"options.url host {target.host!r} does not resolve: {exc}") from None
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise WebhookURLError(f"options.url host {target.host!r} resolves to no address")
    for address in addresses:
        if _is_public(address) or any(_allows(entry, str(address), target.port, target.scheme) for entry in entries):
            continue
        if target.host == "localhost" and address.is_loopback:
            continue
        raise WebhookURLError(f"options.url host {target.host!r} resolves to {address}, a non-public address "
                              "the allow-list does not name (DISPATCH_WEBHOOK_ALLOWED_HOSTS)")
    return [str(address) for address in addresses]
