"""``service.instance.id``: one per process, so each rank and each attempt of a job is its own
instance, whatever the OTel SDK adds or not."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from processes import child_env

import otel_tunix
from otel_tunix.model.resource import service_instance_id
from otel_tunix.testing import capture

INSTANCE = "service.instance.id"

RANK_SCRIPT = """
import json, sys
from opentelemetry import metrics, trace
import otel_tunix

otel_tunix.configure(service_name="trainer", output_dir=None, console_interval=0)
for n in range(3):
    with otel_tunix.step(n, scope="train"):
        pass
ids = {trace.get_tracer_provider().resource.attributes["service.instance.id"],
       metrics.get_meter_provider()._sdk_config.resource.attributes["service.instance.id"]}
otel_tunix.shutdown()
json.dump(sorted(ids), sys.stdout)
"""


def _prometheus_series(out: Any, name: str) -> dict[tuple[Any, ...], list[float]]:
    """The series a Prometheus fed by the collector (its ``prometheus`` exporter, or
    Prometheus's OTLP receiver) makes of metric ``name``: the OTel -> Prometheus rule names
    the target by ``job`` = ``service.namespace/service.name`` and ``instance`` =
    ``service.instance.id``; the data point's attributes are the other labels."""
    series: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for m in out.metrics:
        if m.name != name:
            continue
        namespace = m.resource.get("service.namespace")
        job = (
            f"{namespace}/{m.resource['service.name']}" if namespace else m.resource["service.name"]
        )
        for p in m.points:
            key = (job, m.resource.get(INSTANCE, ""), tuple(sorted(p.attributes.items())))
            series[key].append(p.value if p.value is not None else p.sum)
    return series


def test_two_ranks_are_two_prometheus_series(rotel_collector: Any, tmp_path: Path) -> None:
    procs = []
    for rank in (0, 1):
        env = child_env(
            RANK=str(rank),
            WORLD_SIZE="2",
            OTEL_EXPORTER_OTLP_ENDPOINT=rotel_collector.grpc_endpoint,
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRIC_EXPORT_INTERVAL="200",
            OTEL_TUNIX_QUIET="true",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    reported = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        ids = json.loads(stdout)
        assert len(ids) == 1  # one id within the process: its spans' and its metrics'
        reported.append(ids[0])
    assert reported[0] != reported[1]

    rotel_collector.wait_for(
        lambda text: text.count("tunix.steps") >= 2 and all(i in text for i in reported),
        timeout=30,
    )
    series = _prometheus_series(rotel_collector.parsed(), "tunix.steps")
    train = {k: v for k, v in series.items() if ("scope", "train") in k[2]}
    assert {k[1] for k in train} == set(reported)  # one series per rank, not one merged
    for values in train.values():
        assert values[-1] == 3  # each rank's own count (merged, they would read 6 or flap)


def test_one_instance_per_process_and_the_users_own_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = service_instance_id()
    for _ in range(2):  # a second configure() in the same process: the same instance
        otel_tunix.configure(output_dir=tmp_path / "run", console_interval=0)
        assert trace.get_tracer_provider().resource.attributes[INSTANCE] == first  # type: ignore[attr-defined]
        otel_tunix.shutdown()
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"{INSTANCE}=pod-7")
    with capture() as cap:
        with otel_tunix.step(1):
            pass
        (span,) = [s for s in cap.spans() if s.name == "train_step"]
    assert span.resource.attributes[INSTANCE] == "pod-7"
