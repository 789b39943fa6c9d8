"""What the operator sees of the limits (flow control): per limit and its busiest instances.

Read from the layout the gate writes (``lanes/keys.py``, limits section):
definitions in ``LIMIT_DEFS``, each limit's instances with work in
``limit_instances(name)`` (scored by waiting + holding), and per instance the
holding set, the waiting set, the bucket and the pause. Two pipelined round
trips whatever the number of limits; per limit at most ``SCAN_INSTANCES``
instances are counted (the busiest), so a limit with a million keys costs the
dashboard no more than one with a thousand (its totals are then marked
``partial``).

Only the per-limit figures go to Prometheus (one series per limit name,
whatever the number of keys); the busiest keys (``TOP_KEYS``) are shown on the
dashboard and in ``manage.py lanes --json`` only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lanes import keys

if TYPE_CHECKING:
    from redis import Redis

#: Busiest instances of a limit shown to operators.
TOP_KEYS = 5
#: Instances of a limit whose holding and waiting sets are counted for its totals.
SCAN_INSTANCES = 1000


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class InstanceRow:
    """One instance of a limit: the global one, a chat, or a key."""

    key: str
    in_flight: int
    waiting: int
    tokens: float | None  # tokens left in its bucket (None: no rate, or a full bucket that expired)
    paused_for_s: float  # seconds left of a Retry-After pause (0: not paused)


@dataclass
class LimitRow:
    """A limit as the dashboard, ``manage.py lanes`` and ``/metrics`` show it."""

    name: str
    scope: str
    rate: float | None
    burst: int | None
    max_in_flight: int | None
    fair_share: bool
    window: int | None
    instances: int  # instances with work (waiting or holding)
    in_flight: int
    waiting: int
    partial: bool  # totals counted over the busiest SCAN_INSTANCES instances only
    admitted_per_s: dict[str, float] = field(default_factory=dict)
    throttled_per_s: dict[str, float] = field(default_factory=dict)
    admitted_total: float = 0.0
    throttled_total: float = 0.0
    busiest: list[InstanceRow] = field(default_factory=list)

    @property
    def cap(self) -> int | None:
        """The most tasks of one instance running at once (the fair-share window for such a limit)."""
        return self.window if self.fair_share else self.max_in_flight

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        data = asdict(self)
        data["cap"] = self.cap
        return data


def parse_definitions(raw: Mapping[bytes | str, bytes | str]) -> dict[str, dict[str, Any]]:
    """``LIMIT_DEFS`` decoded; a definition that is not JSON is skipped (the gate ignores it too)."""
    out = {}
    for name, value in raw.items():
        try:
            definition = json.loads(_text(value))
        except ValueError:
            continue
        if isinstance(definition, dict):
            out[_text(name)] = definition
    return out


def instance_value(name: str, base: str) -> str:
    """The key of an instance base: '' for a global limit, else the chat id or limit key."""
    return base[len(keys.limit_base(name, "")):]


def build_rows(defs: Mapping[str, dict[str, Any]], instances: Mapping[str, Sequence[tuple[str, int, int]]],
               instance_counts: Mapping[str, int], fair_in_flight: Mapping[str, int],
               details: Mapping[str, Sequence[InstanceRow]], rates: Mapping[str, dict[str, dict[str, float]]],
               totals: Mapping[str, dict[str, float]]) -> list[LimitRow]:
    """Aggregate what was read (pure; unit tested).

    ``instances[name]``: (base, in_flight, waiting) of the scanned instances;
    ``fair_in_flight[name]``: the limit-wide holding set of a fair-share limit
    (its instances' sets overlap it exactly, so it is exact whatever was scanned);
    ``rates[name]`` / ``totals[name]``: ``{"admitted": ..., "throttled": ...}``.
    """
    rows = []
    for name in sorted(defs):
        d = defs[name]
        scanned = instances.get(name, ())
        count = instance_counts.get(name, 0)
        in_flight = sum(f for _, f, _ in scanned)
        if d.get("fair_share"):
            in_flight = fair_in_flight.get(name, in_flight)
        r = rates.get(name, {})
        t = totals.get(name, {})
        rows.append(LimitRow(
            name=name, scope=str(d.get("scope", "")), rate=d.get("rate"), burst=d.get("burst"),
            max_in_flight=d.get("max_in_flight"), fair_share=bool(d.get("fair_share")), window=d.get("window"),
            instances=count, in_flight=in_flight, waiting=sum(w for _, _, w in scanned),
            partial=count > len(scanned),
            admitted_per_s=r.get("admitted", {}), throttled_per_s=r.get("throttled", {}),
            admitted_total=t.get("admitted", 0.0), throttled_total=t.get("throttled", 0.0),
            busiest=list(details.get(name, ())),
        ))
    return rows


def _tokens(d: dict[str, Any], raw: Sequence[bytes | None], now_ms: int) -> float | None:
    """Tokens in a bucket now, refilled as the gate refills it (a missing bucket is full)."""
    rate, burst = d.get("rate"), d.get("burst")
    if not rate or burst is None:
        return None
    if raw[0] is None:
        return float(burst)
    tokens, ts = float(raw[0]), float(raw[1] or now_ms)
    return round(min(float(burst), tokens + max(0.0, now_ms - ts) * float(rate) / 1000), 2)


def read_limits(client: Redis, now: float, rates: Mapping[str, dict[str, dict[str, float]]],
                totals: Mapping[str, dict[str, float]], top: int = TOP_KEYS,
                scan: int = SCAN_INSTANCES) -> list[LimitRow]:
    """Every defined limit with its totals and its ``top`` busiest instances (two round trips)."""
    defs = parse_definitions(client.hgetall(keys.LIMIT_DEFS))
    if not defs:
        return []
    names = sorted(defs)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.zcard(keys.limit_instances(name))
        pipe.zrevrange(keys.limit_instances(name), 0, max(0, scan - 1))
        pipe.scard(keys.limit_holding(keys.limit_base(name, "")))
    first = pipe.execute()
    bases: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    fair: dict[str, int] = {}
    for i, name in enumerate(names):
        counts[name] = int(first[3 * i])
        bases[name] = [_text(b) for b in first[3 * i + 1]]
        if defs[name].get("fair_share"):
            # The limit-wide set of a fair-share limit is ``limit_base(name, '')``'s holding set.
            fair[name] = int(first[3 * i + 2])
    now_ms = int(now * 1000)
    pipe = client.pipeline(transaction=False)
    for name in names:
        for n, base in enumerate(bases[name]):
            pipe.scard(keys.limit_holding(base))
            pipe.zcard(keys.limit_waiting(base))
            if n < top:
                pipe.hmget(keys.limit_bucket(base), "t", "ts")
                pipe.pttl(keys.limit_paused(base))
    replies = iter(pipe.execute())
    scanned: dict[str, list[tuple[str, int, int]]] = {}
    details: dict[str, list[InstanceRow]] = {}
    for name in names:
        rows: list[tuple[str, int, int]] = []
        shown: list[InstanceRow] = []
        for n, base in enumerate(bases[name]):
            in_flight, waiting = int(next(replies)), int(next(replies))
            rows.append((base, in_flight, waiting))
            if n < top:
                bucket, pttl = next(replies), int(next(replies))
                shown.append(InstanceRow(key=instance_value(name, base), in_flight=in_flight, waiting=waiting,
                                         tokens=_tokens(defs[name], bucket, now_ms),
                                         paused_for_s=round(pttl / 1000, 1) if pttl > 0 else 0.0))
        scanned[name] = rows
        details[name] = shown
    return build_rows(defs, scanned, counts, fair, details, rates, totals)


def counter_rates(minutes: Sequence[Mapping[tuple[str, ...], float]], windows: Sequence[int], elapsed_s: float,
                  rate_fn: Callable[[float, int, float], float]) -> dict[str, dict[str, dict[str, float]]]:
    """``lim_admitted`` / ``lim_throttled`` per second per limit over each window (minutes[0] is current)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind in ("admitted", "throttled"):
        for w in windows:
            sums: dict[str, float] = {}
            for minute in minutes[: w + 1]:
                for k, v in minute.items():
                    if k[0] == f"lim_{kind}" and len(k) == 2:
                        sums[k[1]] = sums.get(k[1], 0.0) + v
            for name, count in sums.items():
                out.setdefault(name, {}).setdefault(kind, {})[f"{w}m"] = round(rate_fn(count, w, elapsed_s), 3)
    return out


def counter_totals(totals: Mapping[tuple[str, ...], float]) -> dict[str, dict[str, float]]:
    """All-time ``lim_admitted`` / ``lim_throttled`` per limit."""
    out: dict[str, dict[str, float]] = {}
    for k, v in totals.items():
        if k[0] in ("lim_admitted", "lim_throttled") and len(k) == 2:
            out.setdefault(k[1], {})[k[0][4:]] = v
    return out
