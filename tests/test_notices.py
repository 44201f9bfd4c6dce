"""The notes a run prints on stderr: where its data goes, where it went, what to run next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from collector import DEBUG_ARGS, RotelCollector
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import otel_tunix
from otel_tunix.run.notices import cli_command, destinations, otlp_endpoint
from otel_tunix.settings.values import load_settings


class _Refusing(SpanExporter):
    """A span exporter whose every export fails (a collector that says no)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE


def _loud(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_TUNIX_QUIET", raising=False)


def test_configure_and_shutdown_say_where_the_data_goes_and_what_to_run_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _loud(monkeypatch)
    out = tmp_path / "run"
    info = otel_tunix.configure(
        service_name="notes",
        output_dir=out,
        perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=2),
        span_exporters=[_Refusing()],
    )
    start = capsys.readouterr().err
    assert start.splitlines()[0] == f"otel-tunix: run {info.run_id} (service notes)"
    assert f"files -> run folder      {out}" in start
    assert "spans -> _Refusing" in start
    assert "recording one step in 2 (sampling_rate=2), all components" in start
    assert "OTEL_TUNIX_QUIET=true" in start

    for n in range(6):
        with otel_tunix.step(n), otel_tunix.component("work"):
            sum(range(20_000 * (n + 1)))  # later steps are slower
    otel_tunix.shutdown()
    end = capsys.readouterr().err
    lines = end.splitlines()
    assert lines[0] == f"otel-tunix: run {info.run_id} finished: train 6 steps (3 recorded)"
    steps = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    steps = [x for x in steps if x["type"] == "step"]
    assert len(steps) == 3
    # each recorded step has a step span and a component span; the refusing exporter
    # failed them all
    assert "_Refusing: 6 spans failed, 0 dropped" in lines[1]
    assert f"next: {cli_command()} summary {out}" in end
    if "perfetto" in info.files:
        assert f"open {info.files['perfetto']} in https://ui.perfetto.dev" in end
    slowest = max(steps, key=lambda x: x["step_time_sec"])
    assert (
        f"slowest train step: {slowest['step']} ({slowest['step_time_sec'] * 1e3:.1f} ms), "
        f"trace id {slowest['trace_id']}" in end
    )


def test_the_next_command_is_one_that_runs_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_ = Path(sys.executable).parent  # this environment's scripts (.venv/bin)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}")
    assert cli_command() == "otel-tunix"  # activated: the name is enough
    monkeypatch.setenv("PATH", str(tmp_path))  # `make demo`, not activated: not on PATH
    assert cli_command() == str(bin_ / "otel-tunix")
    monkeypatch.chdir(bin_.parent.parent)  # from the checkout that holds .venv
    relative = cli_command()
    assert relative == f"{bin_.parent.name}/bin/otel-tunix"
    ran = subprocess.run([relative, "summary", "--help"], capture_output=True, text=True)
    assert ran.returncode == 0 and "otel-tunix summary" in ran.stdout


def test_no_trace_ids_without_a_trace_exporter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _loud(monkeypatch)
    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out)  # the run folder only: nothing looks a trace id up
    for n in range(3):
        with otel_tunix.step(n), otel_tunix.component("work"):
            pass
    otel_tunix.shutdown()
    end = capsys.readouterr().err
    steps = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    slowest = max((x for x in steps if x["type"] == "step"), key=lambda x: x["step_time_sec"])
    line = f"slowest train step: {slowest['step']} ({slowest['step_time_sec'] * 1e3:.1f} ms)"
    assert f"{line}\n" in end or end.endswith(line)
    assert "trace id" not in end


def test_quiet_and_other_ranks_print_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    otel_tunix.configure(output_dir=tmp_path / "a")  # the suite sets OTEL_TUNIX_QUIET=true
    with otel_tunix.step(0):
        pass
    otel_tunix.shutdown()
    assert capsys.readouterr().err == ""
    _loud(monkeypatch)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    otel_tunix.configure(output_dir=tmp_path / "b")
    with otel_tunix.step(0):
        pass
    otel_tunix.shutdown()
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    otel_tunix.configure(output_dir=tmp_path / "c")
    assert "rank 0 of 2" in capsys.readouterr().err.splitlines()[0]
    otel_tunix.shutdown()


def test_each_destination_is_named_with_its_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://metrics:4318/v1/metrics")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp,prometheus")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "console")
    settings = load_settings()
    # the exporters' own rules: /v1/<signal> added to the shared HTTP endpoint only
    assert otlp_endpoint(settings, "traces") == "http://collector:4318/v1/traces"
    assert otlp_endpoint(settings, "metrics") == "http://metrics:4318/v1/metrics"
    dests = destinations(
        settings,
        output_dir=None,
        jsonl_path="extra.jsonl",
        own_tracer_provider=True,
        own_meter_provider=True,
        endpoints={"prometheus": "http://127.0.0.1:9464/metrics"},
    )
    assert [(d.signal, d.name, d.target) for d in dests] == [
        ("spans", "jsonl", "extra.jsonl"),
        ("spans", "otlp", "http://collector:4318/v1/traces (http/protobuf)"),
        ("metrics", "otlp", "http://metrics:4318/v1/metrics (http/protobuf)"),
        ("metrics", "prometheus", "http://127.0.0.1:9464/metrics"),
        ("alerts", "console", ""),
    ]
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    grpc = load_settings()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    assert otlp_endpoint(load_settings(), "traces") == "http://localhost:4317"
    joined = destinations(
        grpc, output_dir=None, jsonl_path=None, own_tracer_provider=False,
        own_meter_provider=False, endpoints={},
    )  # fmt: skip
    assert [d.name for d in joined] == [
        "the application's TracerProvider",
        "the application's MeterProvider",
        "console",
    ]


def test_an_endpoint_that_takes_only_spans_fails_metrics_and_logs_and_the_notice_says_so(
    rotel_factory: Callable[..., RotelCollector],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A real collector with its metric and log receivers off (as Jaeger's OTLP port): it
    # answers metric and log exports with UNIMPLEMENTED.
    traces_only = rotel_factory(
        args=(*DEBUG_ARGS, "--otlp-receiver-metrics-disabled", "--otlp-receiver-logs-disabled")
    )
    _loud(monkeypatch)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", traces_only.grpc_endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "100")
    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out)
    capsys.readouterr()
    for n in range(3):
        with otel_tunix.step(n), otel_tunix.component("work"):
            pass
        otel_tunix.log({"loss": float("nan") if n == 2 else 1.0}, step=n)  # fires an alert
    traces_only.wait_for_spans("train_step", "work")  # spans do get through
    time.sleep(0.3)  # a few periodic metric exports, all refused
    otel_tunix.shutdown()
    end = capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    by_signal = summary["export_by_signal"]
    metrics, logs = by_signal["metrics"]["otlp"], by_signal["logs"]["otlp"]
    assert metrics["exports"] >= 2  # the periodic ones and the last one at shutdown
    assert metrics["exports_failed"] == metrics["exports"]
    assert logs["exports"] >= 1
    assert logs["exports_failed"] == logs["exports"]
    assert summary["export"]["otlp"]["spans_failed"] == 0
    problems = end.splitlines()[1]
    assert "nothing dropped or failed" not in end
    assert f"metrics otlp: {metrics['exports']} of {metrics['exports']} exports failed" in problems
    assert f"logs otlp: {logs['exports']} of {logs['exports']} exports failed" in problems


def test_an_endpoint_that_takes_everything_fails_nothing(
    rotel_collector: RotelCollector,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _loud(monkeypatch)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out)
    with otel_tunix.step(0), otel_tunix.component("work"):
        pass
    otel_tunix.shutdown()
    summary = json.loads((out / "summary.json").read_text())
    metrics = summary["export_by_signal"]["metrics"]["otlp"]
    assert metrics["exports"] >= 1
    assert metrics["exports_failed"] == 0
    assert "nothing dropped or failed" in capsys.readouterr().err
