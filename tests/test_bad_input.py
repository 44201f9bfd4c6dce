"""Bad input from the program or the environment: kept, sanitised or refused by name."""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.sdk.metrics import MeterProvider

import otel_tunix
from otel_tunix.settings.parsing import ConfigurationError

ODD = "step\ud800compute"  # a lone surrogate: not encodable as UTF-8
SHOWN = "step\ufffdcompute"


def _slice_names(path: Path) -> list[str]:
    """Names of the slices that begin in a Perfetto trace (interned or inline)."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    interned: dict[int, str] = {}
    names = []
    for p in trace.packet:
        for n in p.interned_data.event_names:
            interned[n.iid] = n.name
        ev = p.track_event
        if p.HasField("track_event") and ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            names.append(interned[ev.name_iid] if ev.name_iid else ev.name)
    return names


def _torch_int(n: int) -> object:
    return pytest.importorskip("torch").tensor(n)


def _jax_int(n: int) -> object:
    jnp = pytest.importorskip("jax.numpy")
    return jnp.asarray(n, dtype=jnp.int32)


@pytest.mark.parametrize(
    "make",
    [np.int64, np.int32, np.uint16, _torch_int, _jax_int],
    ids=["np.int64", "np.int32", "np.uint16", "torch", "jax"],
)
def test_integer_like_step_numbers_keep_their_value(local_run, make):
    run = local_run()
    for n in range(1001, 1006):
        with otel_tunix.step(make(n)):
            with otel_tunix.component("train_step_compute"):
                pass
    otel_tunix.get_metrics_logger().log("loss", 0.5, step=make(1005))
    otel_tunix.shutdown()
    assert [x["step"] for x in run.steps()] == [1001, 1002, 1003, 1004, 1005]
    logged = [x for x in run.metrics() if x.get("metrics")]
    assert [(x["step"], x["metrics"]) for x in logged if "loss" in x["metrics"]] == [
        (1005, {"loss": 0.5})
    ]


def test_a_step_number_that_is_no_integer_is_counted_and_reported_by_type(local_run, caplog):
    run = local_run()
    with caplog.at_level(logging.WARNING, logger="otel_tunix"):
        for n in ("secret-prompt", 2.5, True):
            with otel_tunix.step(n):  # type: ignore[arg-type]
                pass
    otel_tunix.shutdown()
    assert [x["step"] for x in run.steps()] == [0, 1, 2]  # the scope's count, as documented
    assert "secret-prompt" not in caplog.text
    assert "got a str" in caplog.text


def test_text_values_are_never_echoed_and_a_bad_name_is_said_without_a_traceback(local_run, caplog):
    run = local_run()
    logger = otel_tunix.get_metrics_logger()
    with caplog.at_level(logging.WARNING, logger="otel_tunix"):
        logger.log("completion", "the user's secret prompt", step=1)
        logger.log(None, 1.0, step=1)  # type: ignore[arg-type]
        logger.log_dict({3: 2.0, "loss": 1.5}, step=2)  # type: ignore[dict-item]
        logger.log("loss", 1.0, step=3)
    otel_tunix.shutdown()
    assert "secret" not in caplog.text
    messages = [r.getMessage() for r in caplog.records]
    assert "otel-tunix: metric 'completion' skipped: a str is not a number (24 characters)" in (
        messages
    )
    assert any("metric name must be a string, got a NoneType" in m for m in messages)
    assert any("metric name must be a string, got a int" in m for m in messages)
    assert not any(r.exc_info for r in caplog.records)  # no traceback anywhere
    logged = [x for x in run.metrics() if x.get("metrics")]
    assert [(x["step"], x["metrics"]) for x in logged if "loss" in x["metrics"]] == [
        (2, {"loss": 1.5}),
        (3, {"loss": 1.0}),
    ]


def test_a_lone_surrogate_in_a_name_keeps_every_span_in_the_perfetto_traces(tmp_path):
    pytest.importorskip("perfetto")
    streamed = tmp_path / "streamed"
    otel_tunix.configure(output_dir=tmp_path / "run", system_metrics=False)
    for n in range(20):
        with otel_tunix.step(n):
            with otel_tunix.component(ODD):
                pass
            with otel_tunix.component("optimizer"):
                pass
    otel_tunix.shutdown()
    names = _slice_names(tmp_path / "run" / "trace.pftrace")  # translated at shutdown
    assert names.count(SHOWN) == 20 and names.count("optimizer") == 20
    assert names.count("train_step") == 20

    otel_tunix.configure(
        output_dir="none",
        system_metrics=False,
        perf=otel_tunix.PerformanceMetricsConfig(perfetto_trace_dir=streamed),
    )
    for n in range(20):
        with otel_tunix.step(n):
            with otel_tunix.component(ODD):
                pass
    otel_tunix.shutdown()
    (trace,) = streamed.glob("*.pftrace")
    assert _slice_names(trace).count(SHOWN) == 20


def test_a_lone_surrogate_in_a_label_value_keeps_the_prometheus_scrape_whole():
    pytest.importorskip("prometheus_client")
    from otel_tunix.exporters.prometheus import PrometheusEndpoint

    endpoint = PrometheusEndpoint()
    provider = MeterProvider(metric_readers=[endpoint.reader])
    try:
        hist = provider.get_meter("t").create_histogram("tunix.component.busy_time", unit="s")
        hist.record(0.1, {"component": ODD})
        hist.record(0.2, {"component": "optimizer"})
        with urllib.request.urlopen(endpoint.url, timeout=10) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        provider.shutdown()
    assert f'component="{SHOWN}"' in text and 'component="optimizer"' in text


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("OTEL_TUNIX_OUTPUT_DIR", "{file}", "is a file, not a directory"),
        ("OTEL_TUNIX_OUTPUT_DIR", "{file}/run", "a part of the path is a file"),
        ("OTEL_TUNIX_EXPORT_JSONL_PATH", "{dir}", "is a directory, not a file"),
        ("OTEL_TUNIX_EXPORT_JSONL_PATH", "{file}/spans.jsonl", "a part of the path is a file"),
        ("OTEL_TUNIX_PERFETTO_DIR", "{file}", "is a file, not a directory"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317", "a URL with its scheme"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://", "a URL with its scheme"),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "https://host:70000", "a URL with its scheme"),
    ],
)
def test_a_bad_path_or_endpoint_fails_configure_naming_the_variable(
    tmp_path, monkeypatch, variable, value, said
):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir()
    raw = value.format(file=tmp_path / "a-file", dir=tmp_path / "a-dir")
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ConfigurationError) as err:
        otel_tunix.configure(system_metrics=False)
    assert variable in str(err.value) and said in str(err.value)
    assert "Traceback" not in str(err.value)
    assert (tmp_path / "a-file").read_text() == "x"  # nothing written over it


def test_an_unwritable_perfetto_dir_is_refused_as_such(tmp_path, monkeypatch):
    # Not writable to this process: a directory under a read-only bind would do as well;
    # a path whose parent is a file is what every user (root included) can reproduce, and
    # os.access is what the check reads, so it is asked for a directory mode 0o500 too.
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.setenv("OTEL_TUNIX_PERFETTO_DIR", str(locked))
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked)
    with pytest.raises(ConfigurationError, match=r"OTEL_TUNIX_PERFETTO_DIR=.*not writable"):
        otel_tunix.configure(output_dir="none", system_metrics=False)


@pytest.mark.parametrize("run_id", ["../../escaped", "/abs/path", "a/../../b", "..", "C:\\\\x"])
def test_a_run_id_is_made_safe_as_a_folder_name(tmp_path, monkeypatch, run_id):
    monkeypatch.setenv("OTEL_TUNIX_RUN_ID", run_id)
    info = otel_tunix.configure(system_metrics=False)
    with otel_tunix.step(0):
        pass
    otel_tunix.shutdown()
    assert info.run_id == run_id  # the attribute keeps the id as given
    assert info.output_dir is not None
    folder = info.output_dir.resolve()
    assert folder.parent == (tmp_path / "otel-tunix-runs").resolve()
    assert (folder / "summary.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["otel-tunix-runs"]


BAD_VALUES = {  # a bad value for every setting otel-tunix parses that has a wrong value
    "OTEL_TUNIX_ENABLED": "maybe",
    "OTEL_TUNIX_SAMPLING_RATE": "0",
    "OTEL_TUNIX_OUTPUT_DIR": "/proc/1/no-such-run-folder",
    "OTEL_TUNIX_EXPORT_JSONL_PATH": "/",
    "OTEL_TUNIX_EXPORT_FN": "no-colon",
    "OTEL_TUNIX_LOG_ALL_RANKS": "2",
    "OTEL_TUNIX_PERFETTO_DIR": "/proc/1/no-such-trace-folder",
    "OTEL_TUNIX_PROCESS_INTERVAL_MS": "nan",
    "OTEL_TUNIX_SHUTDOWN_TIMEOUT": "inf",
    "OTEL_TUNIX_ALERTS": "x",
    "OTEL_TUNIX_SYSTEM_METRICS_INTERVAL": "-1",
    "OTEL_TUNIX_RAISE_INTERNAL_ERRORS": "sometimes",
    "OTEL_TUNIX_PROMETHEUS_PORT": "99999",
    "OTEL_EXPORTER_PROMETHEUS_PORT": "abc",
    "DATADOG_ENABLED": "y",
    "OTEL_SDK_DISABLED": "nope",
    "OTEL_TRACES_EXPORTER": "no-such-exporter",
    "OTEL_METRICS_EXPORTER": "no-such-exporter",
    "OTEL_LOGS_EXPORTER": "no-such-exporter",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4317",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "ftp://host:4317",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "udp",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpcs",
    "OTEL_BSP_SCHEDULE_DELAY": "-5",
    "OTEL_BSP_MAX_QUEUE_SIZE": "0",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "x",
    "OTEL_BSP_EXPORT_TIMEOUT": "1.5",
    "RANK": "-1",
    "WORLD_SIZE": "0",
    "LOCAL_RANK": "x",
    "SLURM_PROCID": "a",
}


@pytest.mark.parametrize(("variable", "value"), sorted(BAD_VALUES.items()))
def test_a_bad_value_of_any_setting_fails_configure_naming_it(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=variable):
        otel_tunix.configure(system_metrics=False)


def _nested(depth: int) -> dict:
    top: dict = {}
    inner = top
    for _ in range(depth):
        inner["a"] = {}
        inner = inner["a"]
    return top


def test_a_hostile_run_config_is_flattened_or_refused_by_name(tmp_path, monkeypatch):
    """Issue #36 case 12: a non-string key raised TypeError, a cycle or 10k levels a
    RecursionError, a numpy array with OTEL_TUNIX_RESOURCE_CONFIG_KEYS='*' a ValueError."""
    monkeypatch.setenv("OTEL_TUNIX_RESOURCE_CONFIG_KEYS", "*")
    config = {
        1: "one",
        "lr": 3e-4,
        "weights": np.arange(4.0),
        "scale": np.float32(2.0),
        "opt": {(2, 3): "betas", "eps": 1e-8},
    }
    info = otel_tunix.configure(output_dir=tmp_path / "a", system_metrics=False, run_config=config)
    with otel_tunix.step(0):
        pass
    otel_tunix.shutdown()
    written = json.loads((tmp_path / "a" / "config.json").read_text())
    assert written["1"] == "one" and written["opt"] == {"(2, 3)": "betas", "eps": 1e-8}
    assert written["weights"] == str(np.arange(4.0))
    attrs = info.resource.attributes
    assert attrs["tunix.config.1"] == "one" and attrs["tunix.config.scale"] == 2.0
    assert attrs["tunix.config.opt.eps"] == 1e-8
    assert "tunix.config.weights" not in attrs  # an array is no scalar: left out

    cycle: dict = {"lr": 1}
    cycle["self"] = {"again": cycle}
    for bad, said in ((cycle, "contains itself"), (_nested(10_000), "deeper than 64")):
        with pytest.raises(ConfigurationError, match=f"run_config.*{said}"):
            otel_tunix.configure(output_dir=tmp_path / "b", system_metrics=False, run_config=bad)
        with pytest.raises(ValueError, match=f"set_config.*{said}"):
            otel_tunix.set_config(bad)
    otel_tunix.configure(output_dir=tmp_path / "c", system_metrics=False, run_config=_nested(60))
    otel_tunix.shutdown()


def test_a_nul_in_a_path_is_refused_naming_the_setting(tmp_path):
    """An environment variable cannot hold a NUL; an argument can (a raw ValueError)."""
    with pytest.raises(ConfigurationError, match="output_dir / OTEL_TUNIX_OUTPUT_DIR"):
        otel_tunix.configure(output_dir=str(tmp_path / "x\0y"), system_metrics=False)
    perf = otel_tunix.PerformanceMetricsConfig(export_jsonl_path=str(tmp_path / "s\0.jsonl"))
    with pytest.raises(ConfigurationError, match="export_jsonl_path"):
        otel_tunix.configure(output_dir=tmp_path / "ok", system_metrics=False, perf=perf)
    assert not (tmp_path / "x").exists()


def test_no_free_inodes_is_a_configuration_error_naming_the_folder(tmp_path):
    """A tmpfs with 16 inodes, filled: configure() raised a raw OSError."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=16", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        n = 0
        while True:
            try:
                (mnt / f"f{n}").touch()
            except OSError:
                break
            n += 1
        for folder in (mnt / "run", mnt):
            with pytest.raises(ConfigurationError) as err:
                otel_tunix.configure(output_dir=folder, system_metrics=False, run_config={"a": 1})
            assert "OTEL_TUNIX_OUTPUT_DIR" in str(err.value)
            assert "No space left on device" in str(err.value)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
