"""The campaign's report: a table of every scenario's numbers, written into ``FAULTS.md``.

``make faults`` (``FAULTS_LONG=1``) replaces the part of ``FAULTS.md`` between
the two table markers with the results of the run; the prose around it is
kept as written.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from tests.support.workers import ROOT

#: This run's rows (``FAULTS_RESULTS`` names another file: ``make soak`` runs two campaigns at once).
RESULTS = Path(os.environ.get("FAULTS_RESULTS") or ROOT / "test-artifacts" / "faults-results.jsonl")
FAULTS_MD = ROOT / "FAULTS.md"
START, END = "<!-- faults-table:start -->", "<!-- faults-table:end -->"

COLUMNS = [
    ("scenario", "id"), ("offered", "offered"), ("accepted", "accepted"), ("rejected", "rejected"),
    ("unknown", "unknown"), ("succeeded", "succeeded"),
    ("dead", "dead"), ("lost", "lost"), ("unexpected", "unexpected"), ("dup. effects", "duplicate_effects"),
    ("redeliveries", "redeliveries"), ("same-key overlap", "concurrent_same_key"),
    ("order viol.", "order_violations"), ("stuck", "stuck"),
    ("drain s", "drain_s"), ("run s", "seconds"),
]


def load_rows() -> list[dict]:
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["id"])


def table(rows: list[dict]) -> str:
    head = "| " + " | ".join(name for name, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" if i == 0 else "--:" for i in range(len(COLUMNS))) + "|"
    lines = [head, rule]
    for row in rows:
        cells = []
        for _, key in COLUMNS:
            value = row.get(key)
            cells.append("-" if value is None else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    for row in rows:
        for note in row.get("notes", []):
            notes.append(f"- `{row['id']}`: {note}")
        for name, value in sorted(row.get("extra", {}).items()):
            if name == "by_kind" and list(value) == ["ok"]:
                continue  # a single kind of message: the table says it all
            notes.append(f"- `{row['id']}` {name}: {json.dumps(value)}")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.machine()}, {platform.system()}, Python {platform.python_version()}"
    return "\n".join([f"Run of {stamp} ({machine}), `make faults`:", "", *lines, "",
                      "Measurements and notes of this run:", "", *(notes or ["- none"])])


def write_faults_md() -> None:
    body = table(load_rows())
    text = FAULTS_MD.read_text() if FAULTS_MD.exists() else f"# Fault campaign\n\n{START}\n{END}\n"
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    FAULTS_MD.write_text(f"{head}{START}\n{body}\n{END}{tail}")
