"""Property: a webhook URL the checker accepts means the same host and port to every parser.

URLs are assembled from the pieces different parsers read differently
(backslashes, ``@`` in userinfo and path, percent-encoded and numeric hosts,
IPv6 literals, trailing dots, non-ASCII hosts, ports, whitespace and control
characters). For any URL ``parse_webhook_url`` accepts, urllib3 (which sends)
and ``urllib.parse.urlsplit`` agree on host and port, the allow-list names
them, and the normalised URL it returns parses back to the same; for any other
URL it raises its own ``WebhookURLError`` and nothing else.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from urllib3.util import parse_url

from tasks.webhook_url import DEFAULT_PORTS, WebhookURLError, parse_webhook_url

ALLOW = ["127.0.0.1:*", "localhost", "hooks.example.com:8080", "[::1]:8080", "xn--bcher-kva.example"]
ALLOWED = {("127.0.0.1", None), ("localhost", 80), ("localhost", 443), ("hooks.example.com", 8080),
           ("::1", 8080), ("xn--bcher-kva.example", 80), ("xn--bcher-kva.example", 443)}

ODD = "\\@/?#%:[]. \t\r\n\x00\x7f"
schemes = st.sampled_from(["http", "https", "HTTP", "hTTps", "ftp", "file", "javascript", ""])
separators = st.sampled_from(["://", ":/", ":\\\\", "//", ":", ":///", "://\\"])
userinfo = st.sampled_from(["", "", "", "u@", "u:p@", "a@b@", "127.0.0.1:41065\\@", "localhost\\@", "%40@",
                            "169.254.169.254\\@", ":@"])
hosts = st.one_of(
    st.sampled_from([
        "localhost", "LOCALHOST", "localhost.", "127.0.0.1", "127.0.0.1.", "2130706433", "0x7f.1", "0x7f000001",
        "0177.0.0.1", "127.1", "127.000.000.001", "[::1]", "[::ffff:127.0.0.1]", "[0:0:0:0:0:0:0:1]", "[::1%25lo]",
        "%6cocalhost", "local%68ost", "hooks.example.com", "HOOKS.example.com", "hooks.example.com.",
        "xn--bcher-kva.example", "bücher.example", "BÜCHER.example", "ｌｏｃａｌｈｏｓｔ", "localhost\\@evil",
        "evil.com#@localhost", "evil.com?@localhost", "localhost@evil.com", "[127.0.0.1]", "",
    ]),
    st.text(alphabet="abcxl0179.-:[]@%\\" + "\u0131\u212a", min_size=0, max_size=12),
)
ports = st.one_of(
    st.sampled_from(["", "", ":", ":80", ":443", ":8080", ":0", ":65535", ":65536", ":+80", ": 80", ":080",
                     ":8080\\", ":-1", ":1e3", ":８０８０"]),
    st.integers(min_value=0, max_value=70000).map(lambda n: f":{n}"),
)
tails = st.text(alphabet="ab/\\@?#%:=&. \t\n" + "\x00\u00e9", max_size=16)


def _norm(host: str | None, port: int | None, scheme: str) -> tuple[str, int]:
    host = (host or "").lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port if port is not None else DEFAULT_PORTS.get(scheme.lower(), -1)


def _allowed(host: str, port: int) -> bool:
    return (host, port) in ALLOWED or (host, None) in ALLOWED


@settings(max_examples=400, deadline=None, database=None, derandomize=bool(os.environ.get("CI")),
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.builds(lambda s, sep, u, h, p, t: f"{s}{sep}{u}{h}{p}{t}", schemes, separators, userinfo, hosts, ports, tails),
    st.builds(lambda h, p, t: f"http://{h}{p}/{t}", hosts, ports, tails),
    st.text(alphabet="htp:/\\@lochst.127019[]%#?" + ODD, max_size=40),
))
@example("http://127.0.0.1:41065\\@localhost/hook")
@example("http://169.254.169.254\\@localhost/")
@example("http://localhost:80/a@b")
@example("http://[::1]:8080/x")
def test_accepted_urls_mean_the_same_host_and_port_to_every_parser(url):
    try:
        target = parse_webhook_url(url, ALLOW)
    except WebhookURLError:
        return
    ours = parse_url(url)
    theirs = urlsplit(url)
    scheme = ours.scheme or ""
    assert _norm(ours.host, ours.port, scheme) == _norm(theirs.hostname, theirs.port, theirs.scheme)
    assert ours.auth is None and theirs.username is None and theirs.password is None
    host, port = _norm(ours.host, ours.port, scheme)
    assert (target.host, target.port) == (host, port)
    assert _allowed(host, port), (url, host, port)
    # The URL it hands on (and sends the request for) parses back to the same place.
    again = parse_url(target.url)
    assert _norm(again.host, again.port, again.scheme or "") == (host, port)
    split_again = urlsplit(target.url)
    assert _norm(split_again.hostname, split_again.port, split_again.scheme) == (host, port)
