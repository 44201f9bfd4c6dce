"""configure(): validation, every OTEL_TUNIX_* variable, resources, providers, exporters."""

from __future__ import annotations

import json
import sys
import types

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_tunix
from otel_tunix import ConfigurationError, PerformanceMetricsConfig
from otel_tunix.settings.values import load_settings
from otel_tunix.testing import capture


@pytest.mark.parametrize("bad", [0, -1, 2.5, "4", True, None.__class__])
def test_bad_sampling_rate_names_the_field(bad):
    with pytest.raises(ConfigurationError, match=r"sampling_rate must be a positive integer"):
        PerformanceMetricsConfig(sampling_rate=bad)


@pytest.mark.parametrize("bad", ["train_data_load", ("a", 1), 5, ("",)])
def test_bad_components_names_the_field(bad):
    with pytest.raises(ConfigurationError, match=r"components must be a tuple of"):
        PerformanceMetricsConfig(components=bad)


def test_components_accept_tuple_list_and_none():
    assert PerformanceMetricsConfig(components=["a", "b"]).components == ("a", "b")
    assert PerformanceMetricsConfig(components=None).resolved().components is None


def test_bad_env_sampling_rate_fails_at_configure(monkeypatch):
    monkeypatch.setenv("OTEL_TUNIX_SAMPLING_RATE", "abc")
    with pytest.raises(ConfigurationError, match=r"OTEL_TUNIX_SAMPLING_RATE='abc'"):
        otel_tunix.configure()
    monkeypatch.setenv("OTEL_TUNIX_SAMPLING_RATE", "0")
    with pytest.raises(ConfigurationError, match=r"OTEL_TUNIX_SAMPLING_RATE"):
        otel_tunix.configure()


@pytest.mark.parametrize("bad", [0, -5, 60_001, "100", True])
def test_bad_process_interval_names_the_field(bad):
    with pytest.raises(ConfigurationError, match=r"process_interval_ms must be a number"):
        PerformanceMetricsConfig(process_interval_ms=bad)


def test_process_interval_from_argument_env_and_default(monkeypatch):
    from otel_tunix.recording import hot_path as _recording

    def interval() -> float:
        runtime = _recording.get_runtime()
        assert runtime is not None
        return runtime.pipeline._interval

    otel_tunix.configure(output_dir="none")
    assert interval() == 0.25
    monkeypatch.setenv("OTEL_TUNIX_PROCESS_INTERVAL_MS", "20")
    otel_tunix.configure(output_dir="none")
    assert interval() == 0.02
    otel_tunix.configure(output_dir="none", perf=PerformanceMetricsConfig(process_interval_ms=7))
    assert interval() == 0.007
    otel_tunix.shutdown()
    monkeypatch.setenv("OTEL_TUNIX_PROCESS_INTERVAL_MS", "soon")
    with pytest.raises(ConfigurationError, match=r"OTEL_TUNIX_PROCESS_INTERVAL_MS='soon'"):
        otel_tunix.configure()
    monkeypatch.setenv("OTEL_TUNIX_PROCESS_INTERVAL_MS", "0")
    with pytest.raises(ConfigurationError, match=r"INTERVAL_MS='0' is not allowed; use a number"):
        otel_tunix.configure()


def test_bad_env_boolean_and_export_fn(monkeypatch):
    monkeypatch.setenv("OTEL_TUNIX_ENABLED", "maybe")
    with pytest.raises(ConfigurationError, match=r"OTEL_TUNIX_ENABLED='maybe'"):
        otel_tunix.configure()
    monkeypatch.delenv("OTEL_TUNIX_ENABLED")
    monkeypatch.setenv("OTEL_TUNIX_EXPORT_FN", "no_such_module_xyz:fn")
    with pytest.raises(ConfigurationError, match=r"cannot be imported"):
        otel_tunix.configure()


def test_bad_metrics_logger_and_unknown_exporter(monkeypatch):
    with pytest.raises(ConfigurationError, match=r"metrics_logger must be"):
        otel_tunix.configure(metrics_logger="jsonl")  # type: ignore[arg-type]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "nonexistent")
    with pytest.raises(ConfigurationError, match=r"OTEL_TRACES_EXPORTER names 'nonexistent'"):
        otel_tunix.configure()


def test_env_sampling_rate_components_scope_and_enabled(monkeypatch):
    monkeypatch.setenv("OTEL_TUNIX_SAMPLING_RATE", "3")
    monkeypatch.setenv("OTEL_TUNIX_COMPONENTS", "keep, also")
    monkeypatch.setenv("OTEL_TUNIX_SCOPE", "my.scope")
    with capture() as cap:
        for n in range(7):
            with otel_tunix.step(n):
                for name in ("keep", "drop", "also"):
                    with otel_tunix.component(name):
                        pass
        spans = cap.spans()
    steps = sorted({s.attributes["tunix.step"] for s in spans})
    assert steps == [0, 3, 6]
    assert {s.name for s in spans} == {"keep", "also", "train_step"}
    assert {s.instrumentation_scope.name for s in spans} == {"my.scope"}
    monkeypatch.setenv("OTEL_TUNIX_ENABLED", "false")
    with capture() as cap:
        with otel_tunix.step(0), otel_tunix.component("keep"):
            pass
        assert cap.spans() == []


def test_arguments_beat_environment(monkeypatch):
    monkeypatch.setenv("OTEL_TUNIX_SAMPLING_RATE", "3")
    with capture(perf=PerformanceMetricsConfig(sampling_rate=1)) as cap:
        for n in range(2):
            with otel_tunix.step(n):
                pass
        assert len(cap.spans()) == 2


def test_env_export_fn_and_jsonl_path(monkeypatch, tmp_path):
    mod = types.ModuleType("my_export_mod")
    mod.fn = lambda summary: {"perf/custom/n_spans": len(summary.spans)}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_export_mod", mod)
    monkeypatch.setenv("OTEL_TUNIX_EXPORT_FN", "my_export_mod:fn")
    monkeypatch.setenv("OTEL_TUNIX_EXPORT_JSONL_PATH", str(tmp_path / "extra" / "spans.jsonl.gz"))
    with capture() as cap:
        with otel_tunix.step(0):
            with otel_tunix.component("a"), otel_tunix.component("b"):
                pass
        metrics = cap.metrics()
    assert metrics["perf/custom/n_spans"][0].sum == 2
    import gzip

    lines = gzip.open(tmp_path / "extra" / "spans.jsonl.gz", "rt").read().splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["run", "step", "session"]


def test_env_output_dir_run_id_and_none(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_TUNIX_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("OTEL_TUNIX_RUN_ID", "run-42")
    info = otel_tunix.configure(tracer_provider=TracerProvider())
    assert info.run_id == "run-42"
    assert info.output_dir == tmp_path / "out"
    assert info.resource.attributes["tunix.run.id"] == "run-42"
    with otel_tunix.step(0):  # a run that records no step leaves no files
        pass
    otel_tunix.shutdown()
    assert (tmp_path / "out" / "spans.jsonl").exists()
    monkeypatch.setenv("OTEL_TUNIX_OUTPUT_DIR", "none")
    info = otel_tunix.configure(tracer_provider=TracerProvider())
    assert info.output_dir is None and info.files == {}
    otel_tunix.shutdown()


def test_default_output_dir_is_under_cwd_with_the_run_id(tmp_path):
    info = otel_tunix.configure(tracer_provider=TracerProvider())
    assert info.output_dir == otel_tunix.current_run().output_dir
    assert info.output_dir.parts[:1] == ("otel-tunix-runs",)
    assert info.output_dir.name == info.run_id
    with otel_tunix.step(0):  # a run that records no step leaves no folder
        pass
    otel_tunix.shutdown()
    assert (tmp_path / info.output_dir / "summary.json").exists()


def test_resource_service_name_run_id_host_pid(monkeypatch):
    import os
    import socket

    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=dev,team=ml")
    info = otel_tunix.configure(output_dir="none", tracer_provider=TracerProvider())
    a = info.resource.attributes
    assert a["service.name"] == "from-env"
    assert a["deployment.environment"] == "dev" and a["team"] == "ml"
    assert a["host.name"] == socket.gethostname()
    assert a["process.pid"] == os.getpid()
    assert a["tunix.run.id"]
    assert "tunix.rank" not in a
    info = otel_tunix.configure(
        service_name="explicit", output_dir="none", tracer_provider=TracerProvider()
    )
    assert info.resource.attributes["service.name"] == "explicit"
    otel_tunix.shutdown()


@pytest.mark.parametrize(
    ("env", "rank", "world", "run_id"),
    [
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "abc"},
         3, 8, "torchelastic-abc"),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "777"}, 1, 4, "slurm-777"),
    ],
)  # fmt: skip
def test_rank_and_world_size_from_launchers(monkeypatch, tmp_path, env, rank, world, run_id):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    info = otel_tunix.configure(output_dir=tmp_path, tracer_provider=TracerProvider())
    a = info.resource.attributes
    assert (a["tunix.rank"], a["tunix.world_size"]) == (rank, world)
    assert info.run_id == run_id  # all ranks of one job share the run id
    assert info.files["spans"].name == f"spans-rank{rank}.jsonl"
    otel_tunix.shutdown()


def test_joins_an_application_tracer_provider_without_exporting_twice():
    app_exporter = InMemorySpanExporter()
    app_tp = TracerProvider()
    app_tp.add_span_processor(SimpleSpanProcessor(app_exporter))
    trace.set_tracer_provider(app_tp)
    otel_tunix.configure(service_name="joined", output_dir="none")
    with otel_tunix.step(0), otel_tunix.component("x"):
        trace.get_tracer("user").start_span("user-span").end()
    otel_tunix.shutdown()
    names = [s.name for s in app_exporter.get_finished_spans()]
    assert sorted(names) == ["train_step", "user-span", "x"]
    ours = next(s for s in app_exporter.get_finished_spans() if s.name == "x")
    assert ours.resource.attributes["tunix.run.id"]
    assert ours.resource.attributes["service.name"] == "joined"


def test_installs_global_provider_so_foreign_spans_share_the_pipeline(monkeypatch):
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    from otel_tunix.run import providers

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert [(n, type(e)) for n, e in providers.trace_exporters(load_settings())] == [
        ("console", ConsoleSpanExporter)
    ]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    otel_tunix.configure(output_dir="none")
    installed = trace.get_tracer_provider()
    assert isinstance(installed, TracerProvider)
    exporter = InMemorySpanExporter()
    installed.add_span_processor(SimpleSpanProcessor(exporter))
    with otel_tunix.step(0), otel_tunix.component("x"):
        with trace.get_tracer("user").start_as_current_span("user-span"):
            pass
    otel_tunix.shutdown()
    by = {s.name: s for s in exporter.get_finished_spans()}
    assert set(by) == {"user-span", "x", "train_step"}
    assert by["user-span"].parent.span_id == by["x"].context.span_id
    # a second configure() replaces the provider otel-tunix installed itself
    otel_tunix.configure(output_dir="none")
    second = trace.get_tracer_provider()
    otel_tunix.shutdown()
    assert isinstance(second, TracerProvider) and second is not installed


def _processors(tp: TracerProvider) -> list[str]:
    return [type(p).__name__ for p in tp._active_span_processor._span_processors]


def test_runs_one_after_another_never_pile_processors_onto_an_earlier_provider(monkeypatch):
    """configure/shutdown cycles (notebooks, benchmarks, tests): a run that joins a provider
    it was given must not make the provider an earlier run installed joinable, and runs in
    an application's provider leave only the application's own processors behind."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    app_exporter = InMemorySpanExporter()
    app = TracerProvider()
    app.add_span_processor(SimpleSpanProcessor(app_exporter))
    seen = []
    for _ in range(3):
        otel_tunix.configure(output_dir="none", span_exporters=[InMemorySpanExporter()])
        own = trace.get_tracer_provider()
        assert isinstance(own, TracerProvider) and all(own is not p for p in seen)
        seen.append(own)
        # otel-tunix's consumers are the worker's list; only the export processor (other
        # code's spans) is on the provider
        assert _processors(own) == ["BatchExportProcessor"]
        otel_tunix.shutdown()
        otel_tunix.configure(output_dir="none", tracer_provider=app)
        assert _processors(app) == ["SimpleSpanProcessor"]
        with otel_tunix.step(0), otel_tunix.component("x"):
            pass
        otel_tunix.shutdown()
        assert _processors(app) == ["SimpleSpanProcessor"]
        otel_tunix.configure(output_dir="none")
        fresh = trace.get_tracer_provider()
        assert all(fresh is not p for p in seen)  # not the first run's, shut down
        assert _processors(fresh) == []
        seen.append(fresh)
        otel_tunix.shutdown()
    assert [s.name for s in app_exporter.get_finished_spans()] == ["x", "train_step"] * 3


def test_runs_on_the_same_meter_provider_report_their_own_step_counts():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])

    def steps_metric() -> list[tuple[int, dict[str, object]]]:
        data = reader.get_metrics_data()
        return [
            (p.value, dict(p.attributes))
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "tunix.steps"
            for p in m.data.data_points
        ]

    for run, steps in enumerate((2, 3, 5)):
        otel_tunix.configure(output_dir="none", meter_provider=mp)
        for n in range(steps):
            with otel_tunix.step(n, scope="eval" if run == 2 else "train"):
                pass
        otel_tunix.force_flush()
        scope = "eval" if run == 2 else "train"
        assert steps_metric() == [(steps, {"scope": scope})], run
        otel_tunix.shutdown()
    disabled = PerformanceMetricsConfig(enabled=False)
    otel_tunix.configure(output_dir="none", meter_provider=mp, perf=disabled)
    assert steps_metric() == []  # a disabled run has nothing to report
    otel_tunix.shutdown()


@pytest.mark.parametrize("own_provider", [True, False], ids=["ours", "the application's"])
def test_a_run_that_was_shut_down_is_released(own_provider, tmp_path):
    """Nothing global keeps a finished run (its providers, pipeline, steps) in memory: a
    notebook or a test suite configures many runs in one process. The metric instruments'
    callbacks used to: every run stayed alive for good, and later runs slowed down."""
    import gc
    import weakref

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_tunix.recording import hot_path as _recording

    app = MeterProvider(metric_readers=[InMemoryMetricReader()])
    for run in range(2):
        otel_tunix.configure(
            output_dir=tmp_path / str(run), meter_provider=None if own_provider else app
        )
        for n in range(3):
            with otel_tunix.step(n), otel_tunix.component("train_step_compute"):
                pass
        pipeline = weakref.ref(_recording.get_runtime().pipeline)  # type: ignore[union-attr]
        assert otel_tunix.shutdown()[0].steps == 3
        gc.collect()
        assert pipeline() is None, f"run {run} is still referenced"


def test_otlp_endpoint_env_selects_the_otlp_exporter(monkeypatch):
    from otel_tunix.run import providers

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert load_settings().exporters("traces") == ("otlp",)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    # the SDK's exporter of the protocol (otel-tunix's fast path is a subclass of it)
    exporters = [e for _, e in providers.trace_exporters(load_settings())]
    assert isinstance(exporters[0], Grpc)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    exporters = [e for _, e in providers.trace_exporters(load_settings())]
    assert isinstance(exporters[0], Http)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ConfigurationError, match="http/json"):
        providers.trace_exporters(load_settings())
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert providers.trace_exporters(load_settings()) == []


def test_configure_twice_is_idempotent_and_shutdown_twice_is_safe(tmp_path):
    otel_tunix.configure(output_dir=tmp_path / "a", tracer_provider=TracerProvider())
    otel_tunix.configure(output_dir=tmp_path / "b", tracer_provider=TracerProvider())
    with otel_tunix.step(0):
        pass
    assert len(otel_tunix.shutdown()) == 1
    assert otel_tunix.shutdown() == []
    # the first run, ended by the second configure(), recorded nothing: no folder left
    assert not (tmp_path / "a").exists()  # made by otel-tunix: removed with them
    lines = (tmp_path / "b" / "spans.jsonl").read_text().splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["run", "step", "session"]


def test_env_perfetto_dir_and_none(monkeypatch, tmp_path):
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    monkeypatch.setenv("OTEL_TUNIX_PERFETTO_DIR", str(tmp_path / "traces"))
    info = otel_tunix.configure(output_dir=tmp_path / "run")
    with otel_tunix.step(0), otel_tunix.component("x"):
        pass
    otel_tunix.shutdown()
    files = list((tmp_path / "traces").glob("trace-*.pftrace"))
    assert len(files) == 1 and info.files["perfetto"] == files[0]
    trace_ = Trace()
    trace_.ParseFromString(files[0].read_bytes())
    interned = {e.iid: e.name for p in trace_.packet for e in p.interned_data.event_names}
    names = {
        p.track_event.name or interned.get(p.track_event.name_iid)
        for p in trace_.packet
        if p.HasField("track_event")
    }
    assert {"x", "train_step"} <= names
    assert not list((tmp_path / "run").glob("*.pftrace"))
    monkeypatch.setenv("OTEL_TUNIX_PERFETTO_DIR", "none")
    info = otel_tunix.configure(output_dir=tmp_path / "run2")
    with otel_tunix.step(0):
        pass
    otel_tunix.shutdown()
    assert "perfetto" not in info.files
    assert not list((tmp_path / "run2").glob("*.pftrace"))
    monkeypatch.delenv("OTEL_TUNIX_PERFETTO_DIR")
    info = otel_tunix.configure(output_dir=tmp_path / "run3")  # default: in the run folder
    with otel_tunix.step(0):
        pass
    otel_tunix.shutdown()
    assert info.files["perfetto"].parent == tmp_path / "run3"


def test_otel_traces_exporter_perfetto_through_the_entry_point(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,perfetto")
    monkeypatch.setenv("OTEL_TUNIX_PERFETTO_DIR", str(tmp_path / "pf"))
    info = otel_tunix.configure(output_dir=tmp_path / "run")
    with otel_tunix.step(0), otel_tunix.component("x"):
        pass
    otel_tunix.shutdown()
    files = list((tmp_path / "pf").glob("trace-*.pftrace"))
    assert len(files) == 1 and files[0].stat().st_size > 0  # one exporter, not two
    assert "perfetto" not in info.files  # the run folder did not translate it a second time
    assert not list((tmp_path / "run").glob("*.pftrace"))


def test_no_histograms_are_recorded_when_no_metric_reader_exists(monkeypatch, tmp_path):
    from otel_tunix.consumers.sinks import InstrumentSink
    from otel_tunix.run import setup

    otel_tunix.configure(output_dir="none")  # no OTEL_METRICS_EXPORTER: nothing reads metrics
    sinks = setup._state.consumers.sinks
    otel_tunix.shutdown()
    assert not any(isinstance(s, InstrumentSink) for s in sinks)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")
    otel_tunix.configure(output_dir="none")
    sinks = setup._state.consumers.sinks
    otel_tunix.shutdown()
    assert any(isinstance(s, InstrumentSink) for s in sinks)
