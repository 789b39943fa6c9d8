"""``make soak``: repeat the scenarios where a chat was once seen stuck, to catch it again.

Each run starts two fault campaigns at once (``FAULTS_LONG=1``), each with its own
Redis, workers and load, so each is the other's parallel load (the stall was seen
only on a busy host): scenario 4 (Redis stopped 20 s) with liveness l1 and l2 and S1
(claims that meet Redis down, tests/faults/test_stall.py), and scenario 10 (all at once)
with l3 and l4. It prints, per run and scenario, the
stuck chats and messages the checker counted, the chats the audit had to repair
(``lane|cause``: each one the stall's cause at work, caught), and the evidence folder of any
scenario that failed (tests/faults/conftest.py keeps it). Rows go to
``test-artifacts/soak.jsonl`` as they come, so a soak stopped early keeps what it saw.

``SOAK_RUNS`` (default 5) runs; ``SOAK_SCENARIOS`` overrides the groups
(``;`` between groups run at once, each a pytest ``-k`` expression).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
GROUPS = ("test_04_sigstop or test_l1 or test_l2 or test_s1", "test_10_all_at_once or test_l3 or test_l4")


def chats_of(row: dict) -> int:
    """Stuck chats of a scenario row: the chats of its stuck examples (at most five are kept), at
    least one when any message is stuck."""
    chats = {key.split(":")[1] for key in row.get("examples", {}).get("stuck", []) if key.count(":") >= 2}
    return max(len(chats), 1) if row.get("stuck") else 0


def run_group(run: int, index: int, expr: str) -> subprocess.Popen:
    results = ARTIFACTS / f"soak-{run}-{index}.jsonl"
    results.unlink(missing_ok=True)
    log = open(ARTIFACTS / f"soak-{run}-{index}.log", "wb")
    env = {**os.environ, "FAULTS_LONG": "1", "FAULTS_NO_REPORT": "1", "FAULTS_RESULTS": str(results)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "tests/faults", "-q", "-k", expr],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc


def main() -> int:
    runs = int(os.environ.get("SOAK_RUNS") or 5)
    groups = [g.strip() for g in os.environ.get("SOAK_SCENARIOS", ";".join(GROUPS)).split(";") if g.strip()]
    ARTIFACTS.mkdir(exist_ok=True)
    out = ARTIFACTS / "soak.jsonl"
    total_stuck = 0
    print(f"soak: {runs} runs of {len(groups)} campaigns at once; rows in {out}", flush=True)
    for run in range(1, runs + 1):
        started = time.time()
        procs = [run_group(run, i, expr) for i, expr in enumerate(groups)]
        codes = [p.wait() for p in procs]
        for i, code in enumerate(codes):
            text = (ARTIFACTS / f"soak-{run}-{i}.log").read_text(errors="replace")
            evidence = re.findall(r"evidence kept in: (\S+)", text)
            failed = re.findall(r"^FAILED (\S+)", text, re.M)
            results = ARTIFACTS / f"soak-{run}-{i}.jsonl"
            rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()] \
                if results.exists() else []
            for row in rows:
                stuck = chats_of(row)
                total_stuck += stuck
                line = {"run": run, "scenario": row["id"], "stuck_chats": stuck, "stuck_messages": row.get("stuck"),
                        "lost": row.get("lost"), "order": row.get("order_violations"),
                        "accepted": row.get("accepted"), "drain_s": row.get("drain_s"),
                        "repaired": row.get("extra", {}).get("chats_repaired", {})}
                with open(out, "a") as fh:
                    fh.write(json.dumps({**line, "at": time.strftime("%H:%M:%S")}) + "\n")
                print("soak: " + " ".join(f"{k}={v}" for k, v in line.items()), flush=True)
            print(f"soak: run={run} campaign={i} exit={code} failed={failed or '-'} "
                  f"evidence={evidence or '-'} ({round(time.time() - started)} s)", flush=True)
    print(f"soak: {runs} runs, stuck chats in all: {total_stuck}", flush=True)
    return 1 if total_stuck else 0


if __name__ == "__main__":
    sys.exit(main())
