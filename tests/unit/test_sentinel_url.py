"""Reading ``REDIS_URL=sentinel://...`` as kombu's Sentinel transport does."""

from __future__ import annotations

import pytest

from lanes.redis_client import SentinelTarget, is_sentinel_url, parse_sentinel_url


def test_every_sentinel_and_the_first_part_credentials():
    target = parse_sentinel_url("sentinel://:p%40ss@10.0.0.1:26380;sentinel://10.0.0.2;sentinel://10.0.0.3:26381/0")
    assert target == SentinelTarget((("10.0.0.1", 26380), ("10.0.0.2", 26379), ("10.0.0.3", 26381)), 0, None, "p@ss")


def test_redis_password_serves_when_the_url_has_none():
    assert parse_sentinel_url("sentinel://h:1/2", default_password="pw") == SentinelTarget((("h", 1),), 2, None, "pw")


@pytest.mark.parametrize("url, says", [
    ("sentinel://h:1;redis://h:2", "is not sentinel://"),
    ("sentinel://h:1;sentinel://h:2/3", "name it on the first part"),
    ("sentinel://h:1;sentinel://:pw@h:2", "on the first"),
    ("sentinel://h:1/x", "expected a number"),
])
def test_a_url_the_two_clients_would_read_differently_is_refused(url, says):
    with pytest.raises(ValueError, match=says):
        parse_sentinel_url(url)


def test_is_sentinel_url():
    assert is_sentinel_url("sentinel://h:1") and not is_sentinel_url("redis://h:1/0")
