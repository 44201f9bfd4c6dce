"""Alerts and the system sampler wired into ``configure()`` (the core change of issue 5).

These tests need the core hook ``otel_tunix.recording.step_view.add_step_event`` and the ``alerts``
/ ``system_metrics`` / ``logger_provider`` options of ``configure()``; they skip without them.
"""

from __future__ import annotations

import math
import threading
import time

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

import otel_tunix
from otel_tunix.metrics import get_metrics_summary
from otel_tunix.metrics.alerts import AlertEngine
from otel_tunix.settings.config import ConfigurationError
from otel_tunix.testing import capture


def _alert_events(span):
    return [e for e in span.events if e.name == "tunix.alert"]


def _steps(spans, scope="train"):
    return {s.attributes["tunix.step"]: s for s in spans if s.name == f"{scope}_step"}


def test_alert_inside_a_step_becomes_an_event_of_that_step_span():
    with capture(system_metrics=False) as cap:
        logger = otel_tunix.get_metrics_logger()
        assert any(isinstance(b, AlertEngine) for b in logger.backends)  # on by default
        for n in range(3):
            with otel_tunix.step(n):
                logger.log("kl", 0.2 if n == 1 else 0.01, step=n)
        steps = _steps(cap.spans())
    assert _alert_events(steps[0]) == []
    (fired,) = _alert_events(steps[1])
    assert fired.attributes["tunix.alert.rule"] == "kl_divergence"
    assert fired.attributes["tunix.alert.severity"] == "critical"
    assert fired.attributes["tunix.alert.step"] == 1
    assert steps[1].start_time <= fired.timestamp <= steps[1].end_time
    (resolved,) = _alert_events(steps[2])
    assert resolved.attributes["tunix.alert.severity"] == "ok"


def test_alert_between_steps_goes_on_the_next_step_span():
    with capture(system_metrics=False) as cap:
        logger = otel_tunix.get_metrics_logger()
        for n in range(3):
            with otel_tunix.step(n):
                time.sleep(0.001)
            if n == 0:
                logger.log("loss", math.nan, step=n)  # after the block, as the README does
        steps = _steps(cap.spans())
    assert _alert_events(steps[0]) == []
    (ev,) = _alert_events(steps[1])
    assert ev.attributes["tunix.alert.rule"] == "loss_not_finite"
    assert ev.attributes["tunix.alert.step"] == 0
    assert ev.timestamp == steps[1].start_time  # placed inside the span
    assert ev.attributes["tunix.event.time_unix_nano"] < steps[1].start_time


def test_a_slow_step_flagged_by_the_worker_shows_on_a_later_step_span():
    with capture(system_metrics=False) as cap:
        for n in range(60):  # past the warm-up (50), then three slow steps in a row
            with otel_tunix.step(n):
                time.sleep(0.25 if n in (50, 51, 52) else 0.01)
            if n == 52:
                cap.flush()  # the worker accounts step 52 before step 53 starts
        steps = _steps(cap.spans())
    flagged = {
        n: e.attributes for n, s in steps.items() for e in _alert_events(s)
        if e.attributes["tunix.alert.rule"] == "step_time_spike"
    }  # fmt: skip
    first = min(flagged)
    assert first > 52 and flagged[first]["tunix.alert.step"] == 52
    assert flagged[first]["tunix.alert.metric"] == "perf/train/step_time_sec"


def test_alert_log_record_through_the_configured_logger_provider():
    exporter = InMemoryLogRecordExporter()
    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    with capture(system_metrics=False, logger_provider=lp) as cap:
        with otel_tunix.step(4):
            otel_tunix.get_metrics_logger().log("explained_variance", 0.1, step=4)
            otel_tunix.get_metrics_logger().log("kl", 0.07, step=4)
        step = _steps(cap.spans())[4]
    (record,) = [r.log_record for r in exporter.get_finished_logs()]
    assert record.severity_text == "WARN" and record.trace_id == step.context.trace_id


def test_alerts_off_and_custom_rules():
    with capture(system_metrics=False, alerts=False):
        assert not any(isinstance(b, AlertEngine) for b in otel_tunix.get_metrics_logger().backends)
    from otel_tunix.metrics.alerts import ThresholdRule, above

    rule = ThresholdRule("lr_too_high", ("learning_rate",), critical=above(1e-3))
    with capture(system_metrics=False, alerts=[rule]):
        (engine,) = [
            b for b in otel_tunix.get_metrics_logger().backends if isinstance(b, AlertEngine)
        ]
        otel_tunix.get_metrics_logger().log("learning_rate", 0.01, step=0)
        assert [r.name for r in engine.rules] == ["lr_too_high"]
        assert get_metrics_summary()["alerts"] == [
            {"rule": "lr_too_high", "metric": "learning_rate", "severity": "critical"}
        ]


def test_system_sampler_runs_with_the_run_and_stops_at_shutdown():
    with capture(system_metrics=0.05) as cap:
        time.sleep(0.2)
        names = cap.metrics()
        assert "process.memory.usage" in names
        assert any(t.name == "otel-tunix-system" for t in threading.enumerate())
        assert get_metrics_summary()["system"]["process"]["rss_bytes"] > 0
    time.sleep(0.1)
    assert not any(t.name == "otel-tunix-system" for t in threading.enumerate())


def test_default_logger_counts_for_the_summary():
    with capture(system_metrics=False):
        otel_tunix.get_metrics_logger().log_dict({"loss": 1.0, "kl": 0.01}, step=0)
        s = get_metrics_summary()
    assert s["counts"] == {"loss": 1, "kl": 1}


def test_bad_system_metrics_values_fail_fast(monkeypatch):
    with pytest.raises(ConfigurationError, match="system_metrics"):
        otel_tunix.configure(output_dir="none", system_metrics=-1)
    monkeypatch.setenv("OTEL_TUNIX_SYSTEM_METRICS_INTERVAL", "often")
    with pytest.raises(ConfigurationError, match="OTEL_TUNIX_SYSTEM_METRICS_INTERVAL"):
        otel_tunix.configure(output_dir="none")


def test_alerts_land_in_the_local_run_folder(tmp_path):
    with capture(output_dir=tmp_path / "run", system_metrics=False):
        run = otel_tunix.current_run()
        otel_tunix.get_metrics_logger().log("loss", math.inf, step=0)
    assert run.files["alerts"] == tmp_path / "run" / "alerts.jsonl"
    assert '"tunix.alert.rule": "loss_not_finite"' in run.files["alerts"].read_text()


def test_engine_on_the_applications_own_logger_is_detached_at_shutdown():
    own = otel_tunix.MetricsLogger(otel_tunix.MetricsLoggerOptions(default_backends=False), rank=0)
    with capture(system_metrics=False, metrics_logger=own):
        assert any(isinstance(b, AlertEngine) for b in own.backends)
    assert not any(isinstance(b, AlertEngine) for b in own.backends)
