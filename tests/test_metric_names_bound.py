"""Metric names are bounded: ``log()`` with ever new names (a step number in the key, ids)
holds at most ``OTEL_TUNIX_MAX_METRIC_NAMES`` instruments and their state; the values of
names past it are refused, with one warning, and counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from processes import child_env

import otel_tunix

_CHILD = r"""
import json, sys
import otel_tunix

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

otel_tunix.configure(output_dir=sys.argv[1], system_metrics=False)
for i in range(1000):  # warm up: the first names, caches, the JSONL file
    otel_tunix.log({"warm": float(i)}, step=i)
before = rss_mb()
for i in range(100_000):
    otel_tunix.log({f"metric_{i}": 1.0}, step=i)
grown = rss_mb() - before
otel_tunix.shutdown()
print(json.dumps({"grown_mb": grown}))
"""


def test_a_hundred_thousand_names_hold_the_memory_of_the_bound(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(run)],
        env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    grown = json.loads(proc.stdout.splitlines()[-1])["grown_mb"]
    print(
        f"RSS grew {grown:.1f} MB over 100,000 distinct names "
        "(87 MB without the bound on the 2-core VM)"
    )
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()[1:]]
    names = {n for r in rows for n in r["metrics"]}
    assert len(names) == 2000  # "warm" and the first 1999 metric_<i>
    assert "metric_1998" in names and "metric_1999" not in names
    summary = json.loads((run / "summary.json").read_text())
    assert summary["safety"]["metric_names_refused"] == 100_000 - 1999
    assert proc.stderr.count("OTEL_TUNIX_MAX_METRIC_NAMES") == 1  # warned once
    # without the bound: an instrument and state per name, 87 MB over these 100,000 names
    assert grown < 32, grown


def test_the_bound_is_a_setting_and_covers_the_otel_instruments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_MAX_METRIC_NAMES", "50")
    reader = InMemoryMetricReader()
    otel_tunix.configure(
        output_dir="none", meter_provider=MeterProvider(metric_readers=[reader]),
        system_metrics=False, alerts=False,
    )  # fmt: skip
    logger = otel_tunix.get_metrics_logger()
    for i in range(120):
        otel_tunix.log({f"m{i}": float(i), "m0": 0.0}, step=i)
    assert logger.refused_values == 70
    assert logger.flush()  # the OTel backend records on the logger's thread
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {f"m{i}" for i in range(50)} <= names
    assert not {f"m{i}" for i in range(50, 120)} & names
    otel_tunix.shutdown()
