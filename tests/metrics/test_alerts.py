"""Alert rules (each firing and not firing), transitions, and every action they take:
span events, OTel log records, Datadog events and service checks, one console warning."""

from __future__ import annotations

import logging
import math
import socket
import time

import numpy as np
import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import TracerProvider

import otel_tunix
from otel_tunix.logger.status import get_metrics_summary
from otel_tunix.metrics import alerts as al
from otel_tunix.metrics.alerts import (
    AlertEngine,
    DropRule,
    NonFiniteRule,
    Severity,
    SpikeRule,
    ThresholdRule,
    above,
    below,
    default_rules,
    outside,
)
from otel_tunix.testing import capture


def engine(rules=None, **kw) -> AlertEngine:
    kw.setdefault("datadog", False)
    return AlertEngine(rules, **kw)


def feed(e: AlertEngine, metric: str, values, start: int = 0) -> list[tuple[int, str, str]]:
    """Observe values at consecutive steps; return (step, previous, new) of each transition."""
    out = []
    for i, v in enumerate(values, start):
        for a in e.observe(metric, v, step=i):
            out.append((i, a.previous.name, a.severity.name))
    return out


# --- thresholds ----------------------------------------------------------------------------
def test_threshold_conditions():
    assert above(0.1).breached(0.2) and not above(0.1).breached(0.1)
    assert below(0.5).breached(0.4) and not below(0.5).breached(0.5)
    band = outside(0.1, 0.3)
    assert band.breached(0.05) and band.breached(0.31) and not band.breached(0.2)
    assert band.cleared(0.2, 0.02) and not band.cleared(0.29, 0.02)
    assert not above(0.1).breached(math.nan) and not above(0.1).cleared(math.nan)
    assert str(band) == "outside [0.1, 0.3]" and str(above(0.05)) == "> 0.05"
    with pytest.raises(ValueError):
        outside(0.3, 0.1)


# --- the default rules: each fires and does not fire --------------------------------------
def test_kl_divergence_warning_critical_and_hysteresis():
    e = engine()
    assert feed(e, "kl", [0.01, 0.03, 0.049, 0.05]) == []  # normal (0.05 is not > 0.05)
    got = feed(e, "kl", [0.07, 0.12, 0.09, 0.047, 0.04], start=4)
    assert got == [
        (4, "OK", "WARNING"),
        (5, "WARNING", "CRITICAL"),
        (6, "CRITICAL", "WARNING"),  # 0.09 <= 0.1 - 0.005
        # 0.047 is not back below 0.05 - 0.005: stays
        (8, "WARNING", "OK"),
    ]
    assert feed(e, "actor/kl", [0.2])[0][2] == "CRITICAL"  # */kl matches, own state


def test_kl_hovering_at_the_line_does_not_flap():
    e = engine()
    got = feed(e, "kl", [0.051, 0.049, 0.052, 0.048, 0.051, 0.047])
    assert got == [(0, "OK", "WARNING")]


def test_clip_fraction_too_high_three_in_a_row():
    e = engine()
    assert feed(e, "pg_clipfrac", [0.2, 0.35, 0.4, 0.05, 0.2, 0.6, 0.6, 0.25]) == []
    # an on-policy run (one update per batch) clips nothing: no alert
    assert feed(e, "pg_clipfrac", [0.0] * 10, start=8) == []
    got = feed(e, "pg_clipfrac", [0.6, 0.6, 0.6, 0.2], start=18)
    assert got == [(20, "OK", "CRITICAL"), (21, "CRITICAL", "OK")]
    e2 = engine()
    assert feed(e2, "pg_clipfrac", [0.35, 0.4, 0.45]) == [(2, "OK", "WARNING")]


def test_explained_variance_below_half():
    e = engine()
    assert feed(e, "explained_variance", [0.9, 0.8, 0.4, 0.45, 0.7, 0.55]) == []
    got = feed(e, "explained_variance", [0.3, 0.2, 0.1, 0.52, 0.6], start=6)
    assert got == [(8, "OK", "WARNING"), (10, "WARNING", "OK")]  # 0.52 < 0.5 + 0.05


def test_entropy_sudden_drop_fires_and_slow_decline_does_not():
    rng = np.random.default_rng(1)
    e = engine()
    slow = np.linspace(2.0, 0.5, 200) + rng.normal(0, 0.01, 200)
    assert feed(e, "loss/entropy", slow) == []
    e = engine()
    steady = list(2.0 + rng.normal(0, 0.02, 25))
    assert feed(e, "loss/entropy", steady) == []
    got = feed(e, "loss/entropy", [0.6, 0.55, 1.9], start=25)
    assert got == [(25, "OK", "WARNING"), (27, "WARNING", "OK")]


def test_loss_nan_or_inf():
    e = engine()
    assert feed(e, "loss", [2.3, 2.1, 1e6, -5.0]) == []
    got = feed(e, "loss", [math.nan, math.inf, math.nan, 1.9], start=4)
    assert got == [(4, "OK", "CRITICAL"), (7, "CRITICAL", "OK")]
    assert feed(e, "train/loss", [math.inf]) == [(0, "OK", "CRITICAL")]
    assert feed(e, "loss/policy", [-math.inf]) == [(0, "OK", "CRITICAL")]


def test_step_time_spike_against_median_plus_3_mad():
    rng = np.random.default_rng(2)
    base = list(0.100 + rng.normal(0, 0.003, 60))
    e = engine()
    # Warm-up: no baseline before 50 values, however slow the first steps (compilation).
    assert feed(e, "perf/train/step_time_sec", [0.9, 0.5, 0.5, *base[3:49]]) == []
    assert feed(e, "perf/train/step_time_sec", [*base, 0.104, 0.097], start=49) == []
    # One or two slow steps (a checkpoint, a collection) are no episode; three in a row are.
    got = feed(e, "perf/train/step_time_sec", [0.25, 0.1, 0.25, 0.25, 0.1], start=111)
    assert got == []
    got = feed(e, "perf/train/step_time_sec", [0.25, 0.25, 0.25, 0.108, 0.13, 0.108, 0.1], 116)
    # The limit is ~0.11: 0.108 is under it but not half way back to the median (0.1), so
    # the episode goes on; 0.1 ends it. One episode, reported once.
    assert got == [(118, "OK", "WARNING"), (122, "WARNING", "OK")]
    steady = engine()  # MAD 0: a 5% slower step is not a spike (10% minimum rise)
    assert feed(steady, "step_time_sec", [0.1] * 60 + [0.105] * 3) == []
    assert feed(steady, "step_time_sec", [0.2] * 3, start=63) == [(65, "OK", "WARNING")]


def test_a_steady_loop_of_thousands_of_steps_raises_no_storm():
    # 100 ms steps with 3 % jitter, a slow step every 37 (a checkpoint: 3x) and pairs of
    # slow steps every 101 (collections: 1.5x): what one slow step per episode fired on.
    rng = np.random.default_rng(3)
    times = 0.100 + rng.normal(0, 0.003, 5000)
    times[::37] *= 3.0
    times[::101] *= 1.5
    times[1::101] *= 1.5
    old = engine([SpikeRule("old", ("step_time_sec",), min_absolute=0.01)])
    fired_before = [t for t in feed(old, "step_time_sec", times) if t[2] == "WARNING"]
    e = engine()
    fired = [t for t in feed(e, "step_time_sec", times) if t[2] == "WARNING"]
    # Three episodes, where a checkpoint step and a pair of slow steps fall in a row.
    assert len(fired) == 3 and all(times[n - 2 : n + 1].min() > 0.14 for n, _, _ in fired)
    assert len(fired_before) > 150  # the storm: one episode per slow step (docs/guarantees)
    # A real slowdown (20 steps at twice the time) is one episode, reported once.
    slow = feed(e, "step_time_sec", [0.2] * 20 + [0.1] * 5, start=5000)
    assert slow == [(5002, "OK", "WARNING"), (5020, "WARNING", "OK")]


def test_a_custom_rule_and_metric_globs():
    rule = ThresholdRule("grad_norm_high", ("grad_norm", "*/grad_norm"), critical=above(10.0),
                         consecutive=2)  # fmt: skip
    e = engine([rule, NonFiniteRule("nan", ("*",), severity=Severity.WARNING)])
    assert feed(e, "grad_norm", [1.0, 50.0, 1.0, 50.0]) == []
    assert feed(e, "model/grad_norm", [50.0, 60.0]) == [(1, "OK", "CRITICAL")]
    assert feed(e, "anything", [math.nan]) == [(0, "OK", "WARNING")]
    assert e.active() == {("grad_norm_high", "model/grad_norm"): Severity.CRITICAL,
                          ("nan", "anything"): Severity.WARNING}  # fmt: skip
    with pytest.raises(ValueError):
        ThresholdRule("x", ("m",))
    with pytest.raises(ValueError):
        DropRule("x", ("m",), drop_fraction=1.5)
    with pytest.raises(ValueError):
        AlertEngine([SpikeRule("a", ("m",)), SpikeRule("a", ("n",))])
    assert {r.name for r in default_rules()} == {
        "kl_divergence", "clip_fraction", "explained_variance", "entropy_collapse",
        "loss_not_finite", "step_time_spike", "alloc_retries_growing", "weight_sync_repeated",
    }  # fmt: skip


# --- actions -------------------------------------------------------------------------------
def test_console_warns_once_per_episode(caplog):
    caplog.set_level(logging.WARNING, logger="otel_tunix.metrics.alerts")
    e = engine()
    feed(e, "kl", [0.07] * 10 + [0.2] * 10 + [0.0] + [0.07] * 5)
    lines = [r for r in caplog.records if r.name == "otel_tunix.metrics.alerts"]
    assert [r.levelname for r in lines] == ["WARNING", "ERROR", "WARNING"]
    assert "kl_divergence" in lines[0].getMessage() and "> 0.05" in lines[0].getMessage()
    quiet = engine(console=False)
    caplog.clear()
    feed(quiet, "kl", [0.2])
    assert not [r for r in caplog.records if r.name == "otel_tunix.metrics.alerts"]


def test_otel_log_records_with_severity_and_trace_context():
    exporter = InMemoryLogRecordExporter()
    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    e = engine(logger_provider=lp, console=False)
    tracer = TracerProvider().get_tracer("app")
    with tracer.start_as_current_span("rl_update") as span:
        feed(e, "kl", [0.07, 0.2, 0.0])
    records = [r.log_record for r in exporter.get_finished_logs()]
    assert [(r.severity_text, r.severity_number.value) for r in records] == [
        ("WARN", 13), ("ERROR", 17), ("INFO", 9),
    ]  # fmt: skip
    assert all(r.event_name == "tunix.alert" for r in records)
    assert records[1].attributes["tunix.alert.severity"] == "critical"
    assert records[1].attributes["tunix.alert.step"] == 1
    assert records[1].attributes["tunix.alert.value"] == 0.2
    assert "RESOLVED" in records[2].body
    ctx = span.get_span_context()
    assert {(r.trace_id, r.span_id) for r in records} == {(ctx.trace_id, ctx.span_id)}
    # the application's own recording span gets the events too
    assert [ev.attributes["tunix.alert.severity"] for ev in span.events] == [
        "warning", "critical", "ok",
    ]  # fmt: skip


def test_inside_an_otel_tunix_step_the_log_record_joins_the_step_trace():
    exporter = InMemoryLogRecordExporter()
    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    e = engine(logger_provider=lp, console=False)
    with capture() as cap:
        with otel_tunix.step(5, scope="rl/learner"):
            e.observe("kl", 0.5, step=5)
        spans = cap.spans()
    step_span = next(s for s in spans if s.name == "rl/learner_step")
    (record,) = [r.log_record for r in exporter.get_finished_logs()]
    assert record.trace_id == step_span.context.trace_id
    assert record.span_id == step_span.context.span_id


class _Agent:
    """A bound UDP socket standing in for the Datadog Agent's DogStatsD server."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]

    def lines(self, until: float = 2.0) -> list[str]:
        out: list[str] = []
        end = time.monotonic() + until
        while time.monotonic() < end:
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                if out:
                    break
                continue
            out.extend(x for x in data.decode().split("\n") if x)
        return out


def _events_and_checks(lines: list[str]):
    events, checks = [], []
    for line in lines:
        if line.startswith("_e{"):
            head, rest = line[3:].split("}:", 1)
            tlen, _ = (int(n) for n in head.split(","))
            title = rest[:tlen]
            tail = rest[tlen + 1 :].split("|")
            fields = dict(p.split(":", 1) for p in tail[1:] if ":" in p and not p.startswith("#"))
            tags = next((p[1:].split(",") for p in tail if p.startswith("#")), [])
            events.append((title, fields.get("t"), tags))
        elif line.startswith("_sc|"):
            parts = line.split("|")
            tags = next((p[1:].split(",") for p in parts if p.startswith("#")), [])
            checks.append((parts[1], int(parts[2]), tags))
    return events, checks


@pytest.fixture
def agent():
    a = _Agent()
    yield a
    a.sock.close()


def test_datadog_events_and_service_checks(agent, monkeypatch):
    pytest.importorskip("datadog")
    from otel_tunix.exporters.datadog import DatadogClient

    monkeypatch.setenv("DD_ORIGIN_DETECTION_ENABLED", "false")
    client = DatadogClient(host="127.0.0.1", port=agent.port)
    e = engine(datadog=client, console=False)
    feed(e, "kl", [0.07, 0.08, 0.2, 0.0])
    e.close()  # flushes the client it was given
    events, checks = _events_and_checks(agent.lines())
    client.close()
    assert [(c[0], c[1]) for c in checks] == [
        ("tunix.alert.kl_divergence", 1), ("tunix.alert.kl_divergence", 2),
        ("tunix.alert.kl_divergence", 0),
    ]  # fmt: skip
    assert "rule:kl_divergence" in checks[0][2] and "step:0" in checks[0][2]
    assert [(t, k) for t, k, _ in events] == [
        ("otel-tunix: kl_divergence warning", "warning"),
        ("otel-tunix: kl_divergence critical", "error"),
        ("otel-tunix: kl_divergence resolved", "success"),
    ]


def test_datadog_follows_datadog_enabled(agent, monkeypatch):
    pytest.importorskip("datadog")
    monkeypatch.setenv("DD_ORIGIN_DETECTION_ENABLED", "false")
    monkeypatch.setenv("DD_AGENT_HOST", "127.0.0.1")
    monkeypatch.setenv("DD_DOGSTATSD_PORT", str(agent.port))
    off = AlertEngine(console=False)  # DATADOG_ENABLED unset: nothing is sent
    feed(off, "loss", [math.nan])
    off.close()
    assert agent.lines(until=0.5) == []
    monkeypatch.setenv("DATADOG_ENABLED", "true")
    on = AlertEngine(console=False)
    feed(on, "loss", [math.nan])
    on.close()  # closes the client it created
    events, checks = _events_and_checks(agent.lines())
    assert checks[0][:2] == ("tunix.alert.loss_not_finite", 2)
    assert events[0][1] == "error"


def test_a_failing_action_is_reported_once_and_never_raises(caplog):
    class Broken:
        def service_check(self, *a, **k):
            raise OSError("agent gone")

        def event(self, *a, **k):
            raise OSError("agent gone")

    e = engine(datadog=Broken(), console=False)
    assert len(feed(e, "kl", [0.2, 0.0, 0.2])) == 3
    assert sum("'datadog' failed" in r.getMessage() for r in caplog.records) == 1


# --- wired into a run ----------------------------------------------------------------------
def test_installed_engine_sees_perf_step_times_and_counts_firings():
    with capture() as cap:
        e = al.install(console=False)
        for n in range(60):  # past the warm-up (50), then three slow steps in a row
            with otel_tunix.step(n):
                time.sleep(0.2 if n >= 57 else 0.01)
        otel_tunix.get_metrics_logger().log("kl", 0.3, step=59)
        cap.flush()
        fired = {(a.rule, a.metric) for a in e.history}
        assert ("step_time_spike", "perf/train/step_time_sec") in fired
        assert ("kl_divergence", "kl") in fired
        summary = get_metrics_summary()
        assert {"rule": "kl_divergence", "metric": "kl", "severity": "critical"} in (
            summary["alerts"]
        )
        firings = cap.metrics()["tunix.alert.firings"]
        by_rule = {dict(p.attributes)["rule"]: p.value for p in firings}
        assert by_rule["kl_divergence"] == 1 and by_rule["step_time_spike"] >= 1


def test_installed_engine_writes_transitions_to_the_run_folder(tmp_path):
    import json

    with capture(output_dir=tmp_path / "run"):
        al.install(console=False)
        logger = otel_tunix.get_metrics_logger()
        for n, kl in enumerate([0.01, 0.2, 0.2, 0.0]):
            logger.log("kl", kl, step=n)
    lines = [json.loads(x) for x in (tmp_path / "run" / "alerts.jsonl").read_text().splitlines()]
    assert [(x["tunix.alert.step"], x["tunix.alert.severity"]) for x in lines] == [
        (1, "critical"),
        (3, "ok"),
    ]
    assert lines[0]["tunix.alert.rule"] == "kl_divergence" and "message" in lines[0]


def test_an_engine_installed_after_configure_sends_to_the_runs_providers():
    """alerts.install() after configure() logs through the run's LoggerProvider (no global
    one is set: the records went nowhere while the start notice named the exporter)."""
    exporter = InMemoryLogRecordExporter()
    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    with capture(logger_provider=lp, alerts=False):
        al.install(console=False)
        logger = otel_tunix.get_metrics_logger()
        for n, kl in enumerate([0.01, 0.2, 0.0]):
            logger.log("kl", kl, step=n)
        logger.flush()
    records = [r.log_record for r in exporter.get_finished_logs()]
    assert [r.attributes["tunix.alert.severity"] for r in records] == ["critical", "ok"]
    assert all(r.attributes["tunix.alert.rule"] == "kl_divergence" for r in records)


def test_install_replaces_an_engine_already_on_the_logger():
    with capture():
        logger = otel_tunix.get_metrics_logger()
        first = al.install()
        second = al.install([NonFiniteRule("nan", ("*",))])
        engines = [b for b in logger.backends if isinstance(b, AlertEngine)]
        assert engines == [second] and first._closed


def test_install_before_configure_warns_and_attaches_nothing(caplog):
    otel_tunix.testing.reset()
    e = al.install()
    assert isinstance(e, AlertEngine)
    assert any("before otel_tunix.configure()" in r.getMessage() for r in caplog.records)


def test_rule_window_keeps_its_values_sorted_and_the_median_exact():
    import random
    import statistics

    from otel_tunix.model.alert_rules import _median, _Window

    rng = random.Random(7)
    w = _Window(50)
    for i in range(400):
        w.append(rng.choice([rng.random() * 10, 1.0, 2.5]))  # ties included
        assert w.sorted == sorted(w), i
        assert _median(w) == statistics.median(w)
    assert len(w) == len(w.sorted) == 50


def test_a_batch_of_rows_alerts_as_the_same_values_observed_one_by_one():
    rng = np.random.default_rng(5)
    times = [*(0.1 + rng.normal(0, 0.002, 30)), 0.3, 0.1, 0.31]
    rows = [(i, {"perf/train/step_time_sec": t, "perf/train/idle_time_sec": 0.0, "loss": 1.0})
            for i, t in enumerate(times)]  # fmt: skip
    spike = [SpikeRule("step_time_spike", ("perf/*/step_time_sec",), min_absolute=0.01)]
    one_by_one, batched = engine(spike, console=False), engine(spike, console=False)
    for i, values in rows:
        for name, v in values.items():
            one_by_one.observe(name, v, step=i)
    batched.log_rows(rows[:20])
    batched.log_rows(rows[20:])
    got = [(a.step, a.severity.name) for a in batched.history]
    assert got == [(a.step, a.severity.name) for a in one_by_one.history]
    assert got == [(30, "WARNING"), (31, "OK"), (32, "WARNING")]


def test_a_rule_that_raises_on_one_value_is_reported_once_and_the_batch_goes_on(caplog):
    class Picky(ThresholdRule):
        def level(self, value, history):
            if value == 13.0:
                raise ValueError("unlucky")
            return super().level(value, history)

    rule = Picky("picky", ("grad_norm",), critical=above(10.0))
    e = engine([rule], console=False)
    with caplog.at_level(logging.WARNING, logger="otel_tunix"):
        e.log_rows([(0, {"grad_norm": 13.0}), (1, {"grad_norm": 50.0, "loss": 1.0})])
        e.log_rows([(2, {"grad_norm": 13.0})])
    assert [(a.step, a.severity.name) for a in e.history] == [(1, "CRITICAL")]
    assert sum("alert evaluation failed" in r.getMessage() for r in caplog.records) == 1


def test_watched_names_are_found_in_every_set_of_names_and_a_failed_route_is_retried(
    monkeypatch,
):
    """The engine looks up which names of a row some rule watches once per set of names:
    the same names in another order or with a new name are still found, a name whose
    routing failed is routed again in the next row, and the sets kept are bounded."""

    class Flaky(ThresholdRule):
        fail = True

        def matches(self, metric: str) -> bool:
            if metric == "kl" and Flaky.fail:
                Flaky.fail = False
                raise RuntimeError("routing failed once")
            return super().matches(metric)

    e = engine([Flaky("kl_rule", ("kl",), critical=above(0.1))], console=False)
    # routing "kl" fails in the first row: not evaluated; the next row, with the same set
    # in the same batch, routes it again
    e.log_rows([(0, {"loss": 1.0, "kl": 0.5}), (1, {"loss": 1.0, "kl": 0.5})])
    e.log_rows([(2, {"kl": 0.01, "loss": 1.0})])  # other order
    e.log_rows([(3, {"kl": 0.5, "loss": 1.0, "entropy": 2.0})])  # a new name in the set
    assert [(a.step, a.severity.name) for a in e.history] == [
        (1, "CRITICAL"), (2, "OK"), (3, "CRITICAL"),
    ]  # fmt: skip
    monkeypatch.setattr(al.engine, "_MAX_NAME_SETS", 4)
    for i in range(20):
        e.log_rows([(10 + i, {f"made_up_{i}": 1.0, "kl": 0.01})])
        assert len(e._watched_by_names) <= 4
    assert [a.step for a in e.history][-1] == 10  # resolved at the first of them


def test_one_slow_episode_is_one_alert_under_both_names_of_the_step_time():
    # A trainer logs its own step time (step_time_sec) and the spans give the same
    # quantity (perf/train/step_time_sec): one slow episode fires once and resolves once.
    e = engine()
    rng = np.random.default_rng(5)
    times = [*(0.1 + rng.normal(0, 0.002, 60)), 0.3, 0.3, 0.3, 0.3, 0.1, 0.1]
    said = []
    for n, t in enumerate(times):
        for name in ("step_time_sec", "perf/train/step_time_sec"):
            said += [(n, a.metric, a.severity.name) for a in e.observe(name, t * 1.01, step=n)]
    assert said == [(62, "step_time_sec", "WARNING"), (64, "perf/train/step_time_sec", "OK")]
    # both series did fire and are back: the state is kept per name, only the saying is one
    assert e.active() == {}
    # another scope's step time is another quantity: its own alert
    other = [
        (n, a.metric)
        for n, t in enumerate(times)
        for a in e.observe("perf/eval/step_time_sec", t, step=n)
    ]
    assert other == [(62, "perf/eval/step_time_sec"), (64, "perf/eval/step_time_sec")]
