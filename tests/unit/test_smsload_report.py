"""manage.py smsload's report: what it shares leaves passwords out; its ratio and exit code."""

from __future__ import annotations

from tools.smsload import ModeReport, SmsLoadReport, SmsStep, _redacted, finish


def test_urls_in_the_report_lose_their_password():
    assert _redacted("postgres://app:s3cret@db:5432/dispatch") == "postgres://app:***@db:5432/dispatch"
    assert _redacted("redis://:pw@127.0.0.1:6380/0") == "redis://:***@127.0.0.1:6380/0"
    assert _redacted("postgres://app@db/dispatch") == "postgres://app@db/dispatch"
    assert _redacted(None) is None


def test_ratio_and_exit_code():
    ok = SmsStep(rate=100, passed=True)
    batched = ModeReport("batched", "bench.sms", "", steps=[ok, SmsStep(rate=500, passed=True)], sustained_rate=500)
    single = ModeReport("single", "bench.sms_one", "", steps=[ok, SmsStep(rate=500, why="slow")], sustained_rate=100)
    report = SmsLoadReport(options={}, machine={}, modes=[batched, single])
    finish(report)
    assert report.ratio == 5.0 and report.exit_code == 1  # a step failed, nothing incorrect
    single.steps.append(SmsStep(rate=1000, correct=False, lost=1))
    finish(report)
    assert report.exit_code == 3
