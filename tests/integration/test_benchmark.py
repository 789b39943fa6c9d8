"""``manage.py benchmark --quick``: every row is measured and printed (counts asserted, never speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.benchmark import (
    BATCH_ITEM_COMMANDS_BUDGET,
    DEFAULT_SYSTEMS,
    DEFAULT_WORKLOADS,
    DRAMATIQ_SYSTEMS,
    PEER_PACKAGES,
    PEER_SYSTEMS,
    PLAIN_PATH_COMMANDS_BUDGET,
    SYSTEMS,
    dramatiq_available,
    peer_available,
)

ROOT = Path(__file__).resolve().parents[2]


def _quick(workloads: list[str], systems: list[str] | tuple[str, ...], *extra: str, table: Path | None = None) -> dict:
    """The report of a quick run; with ``table``, the tables it printed are kept there and the report is
    read from ``--json-file`` (one run checks both forms)."""
    report = table.with_suffix(".json") if table else None
    out = subprocess.run(
        [sys.executable, "manage.py", "benchmark", "--quick", "--tasks", "80", "--dispatch-tasks", "200",
         "--warmup", "10", "--instances", "1", "--workloads", ",".join(workloads), "--systems", ",".join(systems),
         *extra, *(["--json-file", str(report)] if report else ["--json"])],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    if table is None:
        return json.loads(out.stdout)
    table.write_text(out.stdout)
    return json.loads(report.read_text())


@pytest.mark.slow
def test_quick_benchmark_prints_every_row(tmp_path):
    # Every system on the dispatch workload (no workers: cheap), printed as the table and
    # saved as JSON by the same run. End to end, each row starts its own workers, so the
    # no-op workload runs the baseline, the platform's plain path and its fastest (batched,
    # bulk-sent), and Dramatiq at its defaults; `make bench` runs every system on every workload.
    assert {"dispatch", "noop", "io"} == set(DEFAULT_WORKLOADS)
    end_to_end = ("celery", "platform", "batch-bulk", "dramatiq-defaults")
    printed = tmp_path / "dispatch.txt"
    report = _quick(["dispatch"], list(SYSTEMS), table=printed)
    report["rows"] += _quick(["noop"], end_to_end)["rows"]
    rows = {(r["workload"], r["system"]): r for r in report["rows"]}
    assert set(rows) == {("dispatch", s) for s in SYSTEMS} | {("noop", s) for s in end_to_end}
    for (workload, system), row in rows.items():
        if not peer_available(system):
            assert row["status"].startswith("skipped"), row
            continue
        assert row["status"] == "ok", row
        assert row["median"] > 0 and row["rates"]
        if (workload, system) == ("dispatch", "batch-bulk"):
            # dispatch_many: one admission call per chunk of 500 items.
            assert 0 < row["redis_round_trips_per_task"] < 1, row
        elif system == "batch-bulk":
            # Admitted by the chunk, claimed and finished by the batch: under one a task.
            assert 0 < row["redis_round_trips_per_task"], row
        elif system == "taskiq":
            assert row["redis_round_trips_per_task"] is None  # its asyncio client: not counted by tools.probe
        else:
            assert row["redis_round_trips_per_task"] >= 1
        if workload != "dispatch" and system in ("platform", "chat"):
            # The platform writes its result row: measured, not assumed.
            assert row["sql_writes_per_task"] >= 1
            # Round trips are counted, not timed: admit, pop, claim, finish, like Celery's
            # publish, pop, unacked record, ack. The platform's two scripts replace kombu's
            # bookkeeping instead of adding to it (before, it was Celery's + 2). Its
            # background calls (maintenance, batched settling) weigh more per task in a
            # run this short: 0.6 more than Celery's once in CI, hence the margin. Since
            # issue 17 the worker's main process also names each popped message in its
            # in-hand set (one pipelined call per pop, lanes.transport) so a killed worker's
            # messages come back within seconds: +1, measured 6.63 against Celery's 4.97.
            # Folding that write into the per-second beat is left to issue 16's budget.
            celery_trips = rows[(workload, "celery")]["redis_round_trips_per_task"]
            assert row["redis_round_trips_per_task"] < celery_trips + 2.5, (row, celery_trips)
    assert rows[("noop", "celery")]["ratio"] == 1
    # The plain path's budget, counted by the benchmark itself (INFO commandstats, commands inside scripts
    # included). A run this short charges each task more of the workers' per-second background (the
    # maintenance pass's scripts, each lane's token-count audit: 4.15-4.19 EVALSHA a task here against 1.9
    # in test_redis_budget; 29.35-30.35 commands a task read here in three runs while test_redis_budget read
    # 20.4), hence the margin; test_redis_budget holds the exact budget, background netted out.
    assert rows[("noop", "platform")]["redis_commands_per_task"] <= PLAIN_PATH_COMMANDS_BUDGET + 8, rows[
        ("noop", "platform")]["commands_by_name"]
    # And per item of a batched type sent in bulk (16-17 before admit_many.lua and the claim's LTRIM).
    assert rows[("noop", "batch-bulk")]["redis_commands_per_task"] <= BATCH_ITEM_COMMANDS_BUDGET + 3, rows[
        ("noop", "batch-bulk")]["commands_by_name"]
    if dramatiq_available():
        # Every row is compared with the faster Dramatiq shape that ran.
        best = max(rows[("noop", s)]["median"] for s in DRAMATIQ_SYSTEMS if ("noop", s) in rows)
        assert rows[("noop", "platform")]["vs_dramatiq"] == round(rows[("noop", "platform")]["median"] / best, 2)
        # And with the fastest peer that ran, named.
        peer = rows[("noop", "platform")]["best_peer"]
        assert peer in PEER_SYSTEMS and rows[("noop", peer)]["vs_peer"] == 1
    # The table form prints the same rows (the dispatch run printed it while saving its JSON).
    text = printed.read_text()
    for system in SYSTEMS:
        assert f"dispatch  {system}" in text, text
    assert set(DEFAULT_SYSTEMS) < set(SYSTEMS)  # the traced systems only with --tracing, or named as here


#: The peers added beside Dramatiq, each at its own defaults.
NEW_PEERS = ("huey", "taskiq")
LATENCY_IDLE = 20


@pytest.fixture(scope="module")
def peers_and_latency() -> dict:
    """One run: the no-op workload, then latency, for the plain path and each new peer installed."""
    systems = ["platform", *(p for p in NEW_PEERS if peer_available(p))]
    report = _quick(["noop", "latency"], systems, "--latency-idle", str(LATENCY_IDLE), "--latency-gap-ms", "5",
                    "--latency-load-s", "0.5")
    return {(r["workload"], r["system"]): r for r in report["rows"]}


@pytest.mark.slow
@pytest.mark.parametrize("peer", NEW_PEERS)
def test_new_peer_rows(peers_and_latency, peer):
    if not peer_available(peer):
        pytest.skip(f"{PEER_PACKAGES[peer]} not installed (pip install -r requirements-bench.txt)")
    row = peers_and_latency[("noop", peer)]
    assert row["status"] == "ok" and row["median"] > 0, row
    assert "its defaults" in row["workers"], row
    # Counted, as for every system: each task's publish and pop at least.
    assert row["redis_commands_per_task"] >= 2, row["commands_by_name"]
    plain = peers_and_latency[("noop", "platform")]
    best = max((r for (w, s), r in peers_and_latency.items() if w == "noop" and s in PEER_SYSTEMS),
               key=lambda r: r["median"])
    assert plain["best_peer"] == best["system"]
    assert plain["vs_peer"] == round(plain["median"] / best["median"], 2)


@pytest.mark.slow
def test_latency_counts_every_task_sent(peers_and_latency):
    rows = {s: r for (w, s), r in peers_and_latency.items() if w == "latency"}
    assert set(rows) == {"platform", *(p for p in NEW_PEERS if peer_available(p))}
    capacity = peers_and_latency[("noop", "platform")]["median"]
    for system, row in rows.items():
        assert row["status"] == "ok", row
        idle, load = row["latency_ms"]["idle"], row["latency_ms"]["load"]
        assert idle["sent"] == LATENCY_IDLE and idle["count"] == idle["sent"], (system, idle)
        assert load["sent"] >= 1 and load["count"] == load["sent"], (system, load)
        for phase in (idle, load):
            assert 0 <= phase["p50"] <= phase["p99"], (system, phase)
        # Paced at half the plain path's no-op rate measured in the same run.
        assert load["capacity"] == capacity, (system, load)
        assert load["sent"] == max(1, round(capacity * 0.5 * 0.5)), (system, load)


@pytest.mark.slow
def test_eight_threads_sending_share_the_platforms_round_trips():
    """``dispatch8``: one producer process, eight threads sending at once. The platform's concurrent
    ``dispatch.delay`` calls travel together (``tasks.bulk.Joiner``): fewer round trips and Redis commands a
    task than one thread's loop in the same run (counted, never timed); a peer's row is measured as its client
    sends; a system whose sender cannot be shared by threads says why it is skipped."""
    systems = ["platform", "batch-bulk", "taskiq", *(s for s in ("dramatiq-defaults",) if peer_available(s))]
    rows = {(r["workload"], r["system"]): r for r in _quick(["dispatch", "dispatch8"], systems)["rows"]}
    one, eight = rows[("dispatch", "platform")], rows[("dispatch8", "platform")]
    assert one["status"] == "ok" and eight["status"] == "ok", (one, eight)
    assert one["redis_round_trips_per_task"] == 1, one  # a lone call: one round trip each
    assert eight["redis_round_trips_per_task"] < 1, eight
    assert eight["redis_commands_per_task"] < one["redis_commands_per_task"], (one["commands_by_name"],
                                                                              eight["commands_by_name"])
    assert eight["workers"] == "none"
    for system in ("batch-bulk", "taskiq"):
        assert rows[("dispatch8", system)]["status"].startswith("skipped: "), rows[("dispatch8", system)]
    if ("dispatch8", "dramatiq-defaults") in rows:
        assert rows[("dispatch8", "dramatiq-defaults")]["status"] == "ok"
        assert rows[("dispatch8", "platform")]["best_peer"] == "dramatiq-defaults"
