"""The webhook URL checker (tasks/webhook_url.py): parsing, the allow-list, the resolved address, redaction."""

from __future__ import annotations

import socket

import pytest

from tasks.webhook_url import WebhookURLError, parse_webhook_url, pin_addresses, redact_url

ALLOW = ["127.0.0.1:*", "localhost:*", "hooks.example.com", "api.example.com:8443", "[::1]:8080"]


@pytest.mark.parametrize("url, host, port, request_uri", [
    ("http://hooks.example.com/x", "hooks.example.com", 80, "/x"),
    ("https://hooks.example.com/x?a=1", "hooks.example.com", 443, "/x?a=1"),
    ("HTTPS://API.Example.com:8443/", "api.example.com", 8443, "/"),
    ("http://127.0.0.1:9000/hook", "127.0.0.1", 9000, "/hook"),
    ("http://localhost:41065/p@q", "localhost", 41065, "/p@q"),  # '@' in the path is path
    ("http://[::1]:8080/v6", "::1", 8080, "/v6"),
])
def test_accepted_urls_name_the_host_and_port_that_are_sent_to(url, host, port, request_uri):
    target = parse_webhook_url(url, ALLOW)
    assert (target.host, target.port, target.request_uri) == (host, port, request_uri)


@pytest.mark.parametrize("url, why", [
    ("http://127.0.0.1:41065\\@localhost/hook", "contains"),
    ("http://169.254.169.254\\@hooks.example.com/", "contains"),
    ("http://user:pw@hooks.example.com/", "credentials"),
    ("http://hooks.example.com@127.0.0.1/", "credentials"),
    ("http://hooks.example.com:8080/", "not allowed"),  # a bare host means its default port
    ("https://api.example.com/", "not allowed"),  # named with another port only
    ("http://other.example.com/", "not allowed"),
    ("ftp://hooks.example.com/", "http:// or https://"),
    ("file:///etc/passwd", "http:// or https://"),
    ("http://2130706433/", "four decimal numbers"),
    ("http://0177.0.0.1/", "four decimal numbers"),
    ("http://127.1/", "four decimal numbers"),
    ("http://0x7f.1/", "numeric address"),
    ("http://localhost./", "plain DNS name"),
    ("http://%6cocalhost/", "percent-encoding"),
    ("http://bücher.example/", "contains"),
    ("http://hooks.example.com /", "contains"),
    ("http://hooks.example.com/\r\nX: y", "contains"),
    ("http://hooks.example.com:99999/", "cannot be parsed"),
    ("", "required"),
    (None, "required"),
])
def test_refused_urls_say_why(url, why):
    with pytest.raises(WebhookURLError, match=why):
        parse_webhook_url(url, ALLOW)


def _resolver(*addresses: str):
    def resolve(host, port, **kwargs):
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in addresses]
    return resolve


@pytest.mark.parametrize("url, addresses, ok", [
    ("http://hooks.example.com/", ["93.184.216.34"], True),
    ("http://hooks.example.com/", ["169.254.169.254"], False),  # cloud metadata
    ("http://hooks.example.com/", ["93.184.216.34", "10.0.0.5"], False),  # one bad record is enough
    ("http://hooks.example.com/", ["127.0.0.1"], True),  # 127.0.0.1 is named in the allow-list
    ("http://hooks.example.com/", ["127.0.0.2"], False),
    ("http://hooks.example.com/", ["::ffff:169.254.169.254"], False),
    ("http://hooks.example.com/", ["0.0.0.0"], False),
    ("http://hooks.example.com/", ["224.0.0.1"], False),
    ("http://localhost:9000/", ["127.0.0.1", "::1"], True),  # localhost is loopback by definition
    ("http://localhost:9000/", ["10.1.2.3"], False),
])
def test_the_resolved_address_must_be_public_unless_named(url, addresses, ok):
    target = parse_webhook_url(url, ALLOW)
    if ok:
        assert pin_addresses(target, ALLOW, resolve=_resolver(*addresses)) == addresses
    else:
        with pytest.raises(WebhookURLError, match="non-public"):
            pin_addresses(target, ALLOW, resolve=_resolver(*addresses))


def test_a_bad_allow_list_entry_is_named():
    with pytest.raises(ValueError, match="host:port"):
        parse_webhook_url("http://a.example/", ["a.example:port"])


@pytest.mark.parametrize("url, shown", [
    ("http://user:pw@host/p?token=abc&x=1#frag", "http://***@host/p?token=***&x=***"),
    ("http://127.0.0.1:41065\\@localhost/hook", "http://***@localhost/hook"),
    ("https://host/p?flag", "https://host/p?flag"),
    ("not a url", "not a url"),
])
def test_redact_url_hides_userinfo_and_query_values(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize("allow, ok", [
    (["127.0.0.1:9000", "evil.example"], False),  # names 127.0.0.1 on port 9000 only, not 443
    (["127.0.0.1", "evil.example"], True),  # the scheme's default port: 443 for https
    (["127.0.0.1:443", "evil.example"], True),
    (["127.0.0.1:*", "evil.example"], True),
])
def test_a_named_address_is_exempt_only_on_the_port_its_entry_names(allow, ok):
    target = parse_webhook_url("https://evil.example/", allow)
    if ok:
        assert pin_addresses(target, allow, resolve=_resolver("127.0.0.1")) == ["127.0.0.1"]
    else:
        with pytest.raises(WebhookURLError, match="non-public"):
            pin_addresses(target, allow, resolve=_resolver("127.0.0.1"))
