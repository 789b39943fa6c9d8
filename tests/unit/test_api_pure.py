"""Pure parts of the HTTP API: token format and checks, reason -> HTTP status, rate windows."""

from __future__ import annotations

from api import statuses, tokens
from api.ratelimit import retry_after_s
from tasks.reasons import REJECTION_REASONS


def test_every_rejection_reason_has_a_documented_status():
    assert set(statuses.REJECTION_STATUS) == set(REJECTION_REASONS)
    assert statuses.status_for(True, None) == 202
    assert statuses.status_for(False, "lane_full") == 429
    assert statuses.status_for(False, "a_reason_added_later") == 422


def test_new_token_parses_back_and_only_its_secret_matches():
    made = tokens.new_token()
    prefix, secret = tokens.parse(made.token)
    assert prefix == made.prefix and len(prefix) == tokens.PREFIX_LEN
    assert tokens.secret_matches(secret, made.secret_hash)
    assert not tokens.secret_matches(secret + "x", made.secret_hash)
    assert secret not in made.secret_hash and tokens.new_token().token != made.token


def test_malformed_tokens_do_not_parse():
    for bad in ("", "dsp_", "dsp_0123456789ab", "dsp_0123456789ab_", "dsp_0123456789abX", "xyz_0123456789ab_s",
                "dsp_ZZZZZZZZZZZZ_secret", "dsp_0123456789ab_" + "s" * 201):
        assert tokens.parse(bad) is None, bad


def test_retry_after_is_whole_seconds_to_the_next_window():
    assert retry_after_s(100.0) == 1 and retry_after_s(100.999) == 1 and retry_after_s(100.2) == 1
