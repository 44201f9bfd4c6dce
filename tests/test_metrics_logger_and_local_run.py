"""MetricsLogger backends and values; the local run folder (spans JSONL, metrics, summary)."""

from __future__ import annotations

import io
import json
import logging
import math
import time

import numpy as np
import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider

import otel_tunix
from otel_tunix import ConfigurationError, MetricsLogger, MetricsLoggerOptions
from otel_tunix.logger.metrics_logger import ConsoleBackend
from otel_tunix.testing import capture


class ListBackend:
    def __init__(self, sink: list, tag: str = "") -> None:
        self.sink, self.tag, self.closed = sink, tag, False

    def log_scalar(self, event, value, **kwargs):
        self.sink.append((self.tag, event, value, kwargs.get("step")))

    def close(self):
        self.closed = True


def test_custom_backend_from_a_lambda_factory_and_tunix_custom_backend_kwarg():
    got: list = []
    opts = MetricsLoggerOptions(
        backend_factories=[lambda: ListBackend(got, "a")],
        backend_kwargs={"custom_backend": [lambda: ListBackend(got, "b")]},
        default_backends=False,
    )
    logger = MetricsLogger(metrics_logger_options=opts, rank=0)
    logger.log("loss", 1.5, step=3)
    logger.log_dict({"rewards/mean": 0.25}, step=4)
    logger.close()
    # each backend gets its values in order (on a thread of its own: see test_user_hooks)
    assert [g for g in got if g[0] == "a"] == [
        ("a", "loss", 1.5, 3),
        ("a", "rewards/mean", 0.25, 4),
    ]
    assert [g for g in got if g[0] == "b"] == [
        ("b", "loss", 1.5, 3),
        ("b", "rewards/mean", 0.25, 4),
    ]
    assert all(b.closed for b in logger.backends)


def test_values_from_numpy_torch_python_and_nonfinite(caplog):
    got: list = []
    opts = MetricsLoggerOptions(
        backend_factories=[lambda: ListBackend(got)], default_backends=False
    )
    logger = MetricsLogger(opts, rank=0)
    logger.log("a", np.float32(0.5), step=0)
    logger.log("b", torch.tensor(2.0), step=0)
    logger.log("c", np.array([3.0]), step=0)
    logger.log("d", 7, step=0)
    with caplog.at_level(logging.WARNING):
        logger.log("nan", float("nan"), step=1)
        logger.log("nan", float("nan"), step=2)
        logger.log("inf", torch.tensor(float("inf")), step=1)
        logger.log("vec", torch.ones(3), step=1)
        logger.log("text", "hello", step=1)
    assert logger.flush()  # the test's backend runs on a thread of its own
    values = {e: v for _, e, v, _ in got}
    assert values["a"] == 0.5 and values["b"] == 2.0 and values["c"] == 3.0 and values["d"] == 7
    assert math.isnan(values["nan"]) and math.isinf(values["inf"])
    assert "vec" not in values and "text" not in values  # skipped, not raised
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("'nan'" in m for m in msgs) == 1  # flagged once per name
    assert any("'vec'" in m for m in msgs) and any("'text'" in m for m in msgs)


def test_only_rank_zero_logs_by_default(monkeypatch):
    got: list = []
    opts = MetricsLoggerOptions(
        backend_factories=[lambda: ListBackend(got)], default_backends=False
    )
    MetricsLogger(opts, rank=1).log("loss", 1.0, step=0)
    assert got == []
    every = MetricsLogger(MetricsLoggerOptions(**{**opts.__dict__, "log_all_ranks": True}), rank=1)
    every.log("loss", 1.0, step=0)
    assert every.flush() and len(got) == 1
    monkeypatch.setenv("OTEL_TUNIX_LOG_ALL_RANKS", "true")
    rank2 = MetricsLogger(opts, rank=2)
    rank2.log("loss", 2.0, step=0)
    assert rank2.flush() and len(got) == 2
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("OTEL_TUNIX_LOG_ALL_RANKS")
    assert not MetricsLogger(opts).active  # rank detected from the launcher


def test_a_failing_backend_is_reported_once_and_others_still_log(caplog):
    got: list = []

    class Broken:
        def log_scalar(self, event, value, **kwargs):
            raise OSError("disk full")

        def close(self):
            pass

    opts = MetricsLoggerOptions(
        backend_factories=[Broken, lambda: ListBackend(got)], default_backends=False
    )
    logger = MetricsLogger(opts, rank=0)
    for i in range(3):
        logger.log("loss", float(i), step=i)
    assert logger.flush()
    assert len(got) == 3
    assert sum("Broken failed" in r.getMessage() for r in caplog.records) == 1


def test_options_are_validated():
    with pytest.raises(ConfigurationError, match="flush_every_n_steps"):
        MetricsLoggerOptions(flush_every_n_steps=0)
    with pytest.raises(ConfigurationError, match="factories"):
        MetricsLoggerOptions(backend_factories=["jsonl"])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="no log_scalar"):
        MetricsLogger(MetricsLoggerOptions(backend_factories=[lambda: object()]), rank=0)


def test_jsonl_backend_records_and_console_backend(tmp_path):
    logger = MetricsLogger(
        MetricsLoggerOptions(log_dir=tmp_path, project_name="p", run_name="r"), run_id="id1", rank=0
    )
    logger.log("loss", 0.5, step=1)
    logger.log("loss", float("nan"), step=2)
    logger.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["type"] == "meta" and lines[0]["project"] == "p" and lines[0]["run"] == "r"
    assert lines[1]["step"] == 1 and lines[1]["metrics"] == {"loss": 0.5}
    assert math.isnan(lines[2]["metrics"]["loss"]) and lines[2]["nonfinite"] is True
    buf = io.StringIO()
    ConsoleBackend(buf).log_scalar("loss", 0.25, step=7)
    assert buf.getvalue() == "[step 7] loss = 0.25\n"


def test_otel_backend_publishes_user_scalars_on_catalog_instruments_but_not_perf():
    with capture() as cap:
        logger = otel_tunix.get_metrics_logger()
        logger.log("loss", 2.5, step=0)
        logger.log("rewards/mean", 0.75, step=0)
        logger.log("eval/accuracy", 0.5, step=0)
        with otel_tunix.step(0):
            pass
        metrics = cap.metrics()
        units = cap.metric_units()
    (loss,) = metrics["tunix.training.loss"]
    assert loss.value == 2.5 and dict(loss.attributes) == {"tunix.training.mode": "train"}
    assert metrics["tunix.rl.reward.mean"][0].value == 0.75
    assert metrics["eval.accuracy"][0].value == 0.5  # not in the catalog: a dotted gauge
    assert not any(name.startswith("perf") for name in metrics)
    assert units["tunix.training.loss"] == "1"


def test_local_run_folder_spans_jsonl_format_session_line_and_summary(tmp_path):
    out = tmp_path / "run"
    perf = otel_tunix.PerformanceMetricsConfig(sampling_rate=2)
    otel_tunix.configure(output_dir=out, perf=perf, tracer_provider=TracerProvider())
    for n in range(4):
        with otel_tunix.step(n):
            with otel_tunix.component("train_data_load"):
                time.sleep(0.002)
            with otel_tunix.component("train_queue_wait", blocked=True):
                time.sleep(0.002)
        if n == 0:
            otel_tunix.force_flush()
            # written and flushed as the step ends: readable while the run goes on
            first = (out / "spans.jsonl").read_text().splitlines()
            assert len(first) == 2 and json.loads(first[1])["step"] == 0
    otel_tunix.get_metrics_logger().log("loss", 1.25, step=3)
    sessions = otel_tunix.shutdown()
    lines = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    run, steps, session = lines[0], lines[1:-1], lines[-1]
    assert run["type"] == "run" and run["sampling_rate"] == 2
    assert run["resource"]["tunix.run.id"] == run["run_id"]
    assert run["start_ns"] <= steps[0]["start_ns"]
    assert [x["step"] for x in steps] == [0, 2]
    for x in steps:
        assert x["type"] == "step" and x["scope"] == "train"
        assert x["start_ns"] < x["end_ns"]
        assert x["busy_time_sec"] > 0 and x["blocked_time_sec"] > 0 and x["idle_time_sec"] >= 0
        assert set(x["components"]) == {"train_data_load", "train_queue_wait"}
        assert x["components"]["train_queue_wait"]["blocked_time_sec"] > 0
        kinds = {s["name"]: s["kind"] for s in x["spans"]}
        assert kinds == {"train_data_load": "busy", "train_queue_wait": "blocked"}
        for s in x["spans"]:
            assert {"name", "kind", "start_ns", "end_ns", "thread", "parent"} <= set(s)
            assert x["start_ns"] <= s["start_ns"] <= s["end_ns"] <= x["end_ns"]
    assert session["type"] == "session" and session["steps"] == 4
    assert session["sampled_steps"] == 2 and session["steps_per_sec"] > 0
    assert session["busy_time_sec"] == pytest.approx(sum(x["busy_time_sec"] for x in steps))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scopes"][0]["steps"] == 4 and summary["sampling_rate"] == 2
    assert sessions[0].steps == 4
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    names = {k for m in metrics for k in m.get("metrics", {})}
    assert {"loss", "perf/train/busy_time_sec", "perf/train/train_queue_wait/blocked_time_sec"} <= (
        names
    )


def test_queue_full_drops_and_counts_without_blocking():
    from otel_tunix.pipeline.worker import Pipeline
    from otel_tunix.recording.hot_path import Runtime, StepRecord

    release = __import__("threading").Event()
    processed = []

    def slow(recs):
        release.wait(5)
        processed.extend(rec.number for rec in recs)
        return 0

    p = Pipeline(slow, max_queued_steps=2)
    rt = Runtime(1, None, p)
    t0 = time.perf_counter()
    for n in range(10):
        rec = StepRecord(rt, "train", n, time.perf_counter_ns())
        rec.end_ns = time.perf_counter_ns()
        p.submit(rec)
    assert time.perf_counter() - t0 < 0.5  # never waits for the worker
    release.set()
    p.close()
    assert p.dropped_steps >= 7
    assert len(processed) + p.dropped_steps == 10


def test_a_full_logger_queue_drops_rows_and_counts_them():
    """The backends run on the logger's thread; what its queue cannot hold while they fall
    behind is dropped and counted (``summary.json``'s ``safety.metric_rows_dropped``)."""
    import threading

    from otel_tunix.logger.backend import LoggingBackend
    from otel_tunix.logger.metrics_logger import QUEUE_CAPACITY
    from otel_tunix.settings import tally as _tally

    release = threading.Event()
    got: list[int] = []

    class Held(LoggingBackend):
        def log_rows(self, rows, **kwargs):
            release.wait(30)
            got.extend(step for step, _ in rows)

    logger = MetricsLogger(MetricsLoggerOptions(default_backends=False), rank=0)
    logger.backends.append(Held())  # appended by hand: on the logger's thread itself
    before = _tally.snapshot().get("metric_rows_dropped", 0)
    n = QUEUE_CAPACITY + 3000  # more than the queue and the batch the thread took hold
    for i in range(n):
        logger.log("loss", float(i), step=i)
    assert logger.last_values == {"loss": float(n - 1)}  # on the caller's thread
    release.set()
    assert logger.flush()
    dropped = _tally.snapshot().get("metric_rows_dropped", 0) - before
    assert dropped > 0
    assert len(got) + dropped == n
    assert got == sorted(got)  # in order, the dropped ones missing
    assert logger.close() == []


def test_backends_run_on_the_loggers_thread_and_the_alert_kind_on_the_callers():
    import threading

    from otel_tunix.logger.backend import LoggingBackend
    from otel_tunix.metrics.alerts import AlertEngine

    seen: list[tuple[str, str, list[int]]] = []

    class Where(LoggingBackend):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def log_rows(self, rows, **kwargs):
            seen.append((self.tag, threading.current_thread().name, [s for s, _ in rows]))

    class Here(Where):
        on_callers_thread = True  # as the alert engine

    assert AlertEngine.on_callers_thread and not LoggingBackend.on_callers_thread
    me = threading.current_thread().name
    logger = MetricsLogger(MetricsLoggerOptions(default_backends=False), rank=0)
    logger.backends.append(Where("queued"))
    logger.log("loss", 1.0, step=0)
    logger.backends.append(Here("inline"))  # added after the first row: sorted again
    logger.log("loss", 2.0, step=1)
    assert logger.flush()
    assert [x for x in seen if x[0] == "inline"] == [("inline", me, [1])]
    queued = [x for x in seen if x[0] == "queued"]
    assert {name for _, name, _ in queued} == {"otel-tunix-metrics"}
    assert [s for _, _, steps in queued for s in steps] == [0, 1]  # in order
    logger.backends = [Here("swapped")]  # a new list: sorted again too
    logger.log("loss", 3.0, step=2)
    assert logger.flush()
    assert seen[-1] == ("swapped", me, [2])
    assert logger.close() == []
