"""Per-call CPU of the dispatch path's JSON: ``tasks.validation.encode_json``, ``lanes.messages.build_message``
and ``tasks.admission.prepare`` (both of them and the rest of an item's Python).

Run it from two checkouts in one go to compare them side by side (rounds
alternate between the checkouts, each a separate process; the figure is the
least CPU time per call over the rounds, which other load on the machine
moves least)::

    git worktree add /tmp/before <commit>
    .venv/bin/python scripts/measure_json.py --root /tmp/before --root . --rounds 5

Used for BENCHMARKS.md's *JSON of a dispatch*.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import timeit

PAYLOADS = {
    "tiny (21 B)": {"n": 12345, "ms": 0},
    "sms (94 B)": {"to": "+15550001234", "text": "hello world, your code is 123456", "n": 7, "tags": ["a", "b"]},
    "large (920 B)": {f"k{i}": {"x": i, "s": "v" * 20} for i in range(20)},
    "non-ASCII (37 B)": {"t": "héllo wörld ✓"},
}


def measure(calls: int) -> dict[str, float]:
    """One process's figures, µs of CPU per call (the best of 5 batches of ``calls``)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatchsite.settings")
    import django

    django.setup()
    from lanes.messages import Envelope, build_message
    from tasks.validation import encode_json

    def best(fn) -> float:
        timer = timeit.Timer(fn, timer=time.process_time)
        return min(timer.timeit(calls) for _ in range(5)) / calls * 1e6

    out = {f"encode_json {name}": best(lambda p=payload: encode_json(p)) for name, payload in PAYLOADS.items()}
    now = time.time()
    envelopes = {
        "plain": Envelope(type="bench.plain", lane="bench-plain", priority=5, attempt=1, deadline=now + 60,
                          dispatched_at=now),
        "chat, key, meta": Envelope(type="chat.send", lane="realtime", priority=5, attempt=1, deadline=now + 60,
                                    dispatched_at=now, chat="chat-42", key="k-1", meta={"trace": "abc"}),
    }
    payload_json = encode_json(PAYLOADS["tiny (21 B)"])
    task_id = "0123456789abcdef0123456789abcdef"
    for name, env in envelopes.items():
        out[f"build_message {name}"] = best(
            lambda e=env: build_message(task_id, "bench.work", payload_json, e, 10.0, 17.0))
    out.update(_prepare(best, task_id))
    return out


def _prepare(best, task_id: str) -> dict[str, float]:
    """``tasks.admission.prepare`` of one item (validation, envelope, message), on a snapshot made here: the
    per-item Python of ``dispatch.delay`` and ``dispatch_many``; empty when its signature is not this one."""
    from tasks import admission, config
    from tasks.retry import Backoff

    types = {name: config.TypeConf(name=name, handler="bench.work", lane="bench-plain", priority=5, timeout_s=60.0,
                                   attempt_timeout_s=10.0, chat_scoped=chat, chat_queue_size=64,
                                   max_payload_bytes=65536, idempotency_window_s=86400, enabled=True, options={},
                                   policy=Backoff(3, 0.1, 2.0, 1.0, 0.1))
             for name, chat in (("bench.plain", False), ("bench.chat", True))}
    snap = config.Snapshot(version="1", lanes={"bench-plain": config.LaneConf("bench-plain", 10**6, True)},
                           types=types)
    try:
        shared = admission.shared_settings()
        calls = {
            "prepare plain": lambda: admission.prepare(snap, "bench.plain", PAYLOADS["sms (94 B)"], task_id=task_id,
                                                       shared=shared),
            "prepare chat, key": lambda: admission.prepare(snap, "bench.chat", PAYLOADS["sms (94 B)"],
                                                           task_id=task_id, chat_id="chat-42",
                                                           idempotency_key="k-1", shared=shared),
        }
        for call in calls.values():
            call()
    except (AttributeError, TypeError) as exc:
        print(f"prepare not measured: {exc}", file=sys.stderr)
        return {}
    return {name: best(call) for name, call in calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", action="append", help="a checkout to measure (repeatable; default: this one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: measure, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.calls)))
        return
    roots = [os.path.abspath(root) for root in (args.root or ["."])]
    best: dict[str, dict[str, float]] = {root: {} for root in roots}
    for _ in range(args.rounds):
        for root in roots:
            env = {**os.environ, "PYTHONPATH": root}
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "--calls", str(args.calls)],
                                 cwd=root, env=env, check=True, capture_output=True, text=True).stdout
            for name, value in json.loads(out).items():
                best[root][name] = min(value, best[root].get(name, value))
    names = list(best[roots[0]])
    print("| µs of CPU per call (least of the rounds) | " + " | ".join(roots) + " |")
    print("|---|" + "--:|" * len(roots))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{best[root].get(name, float('nan')):.2f}" for root in roots) + " |")


if __name__ == "__main__":
    main()
