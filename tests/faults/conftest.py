"""Fixtures of the fault campaign, and its report (``FAULTS.md`` when run by ``make faults``)."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.faults import report
from tests.faults.harness import ARTIFACTS, LONG, FaultCluster


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/faults/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.faults)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A scenario that failed keeps its evidence while its Redis still runs (before the teardown), and
    its failure message names the folder."""
    outcome = yield
    rep = outcome.get_result()
    clusters = getattr(item, "fault_clusters", None)
    if rep.when != "call" or not rep.failed or not clusters:
        return
    kept = []
    for cluster in clusters:
        try:
            kept.append(str(cluster.keep_evidence(item.name)))
        except Exception as exc:  # noqa: BLE001 - the failure itself must still be reported
            kept.append(f"(evidence of {cluster.dir.name} not kept: {exc!r})")
    text = "evidence kept in: " + ", ".join(kept) + " (CI keeps test-artifacts/ as the run's output)"
    if hasattr(rep.longrepr, "addsection"):
        rep.longrepr.addsection("fault evidence", text)
    else:
        rep.sections.append(("fault evidence", text))


@pytest.fixture
def cluster_factory(tmp_root, request):
    """Start ``FaultCluster``s (own Redis each); all are closed when the test ends."""
    from tests.support.http_sink import SinkServer

    made: list[FaultCluster] = []
    request.node.fault_clusters = made
    sinks: list[SinkServer] = []

    def make(**kwargs) -> FaultCluster:
        sink = SinkServer().__enter__()
        sinks.append(sink)
        cluster = FaultCluster(tmp_root, sink, **kwargs)
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.close()
    for sink in sinks:
        sink.__exit__(None, None, None)


@pytest.fixture
def record():
    """Keep a scenario's report for FAULTS.md (and test-artifacts/faults-results.jsonl)."""

    def keep(scenario_id: str, rep, started: float) -> None:
        row = {"id": scenario_id, "long": LONG, "seconds": round(time.time() - started, 1), **rep.as_dict()}
        ARTIFACTS.mkdir(exist_ok=True)
        with open(report.RESULTS, "a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
        print(rep.summary())

    return keep


# Imported once per session, at collection: start this run's results afresh.
report.RESULTS.unlink(missing_ok=True)


def pytest_sessionfinish(session, exitstatus):
    # A soak (``FAULTS_NO_REPORT=1``) repeats a few scenarios: its rows are not the campaign's table.
    if LONG and report.RESULTS.exists() and not os.environ.get("FAULTS_NO_REPORT"):
        report.write_faults_md()
