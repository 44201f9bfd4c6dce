"""``otel_tunix.log(dict, step=)`` and the run's config (``run_config=`` / ``set_config``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_tunix


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_log_takes_a_dict_of_a_step_and_warns_once_before_configure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        otel_tunix.log({"loss": 1.0}, step=0)
        otel_tunix.log({"loss": 2.0}, step=1)
    before = [r for r in caplog.records if "before otel_tunix.configure()" in r.getMessage()]
    assert len(before) == 1

    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out)
    np = pytest.importorskip("numpy")
    otel_tunix.log({"loss": np.float32(2.5), "learning_rate": 3e-4}, step=7)
    otel_tunix.log({"loss": 2.25})
    with pytest.raises(TypeError, match="takes a dict"):
        otel_tunix.log("loss", 1.0)  # type: ignore[arg-type]
    otel_tunix.shutdown()
    logged = [r for r in _rows(out / "metrics.jsonl") if "loss" in r.get("metrics", {})]
    assert [(r.get("step"), r["metrics"]) for r in logged] == [
        (7, {"loss": 2.5, "learning_rate": 3e-4}),
        (None, {"loss": 2.25}),
    ]


def test_run_config_goes_to_config_json_and_the_keys_named_to_the_resource(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_RESOURCE_CONFIG_KEYS", "model.*, seed,lr,batch,tags")
    spans = InMemorySpanExporter()
    otel_tunix.set_config({"model": {"layers": 2, "d_model": 64}}, seed=1)  # before: kept
    out = tmp_path / "run"
    info = otel_tunix.configure(
        output_dir=out,
        span_exporters=[spans],
        run_config={"lr": 3e-4, "batch": 16, "tags": ["a", "b"], "seed": 2},
    )
    assert info.files["config"] == out / "config.json"
    with otel_tunix.step(0), otel_tunix.component("work"):
        pass
    assert otel_tunix.set_config(warmup=20)["warmup"] == 20  # after: config.json only
    otel_tunix.shutdown()
    assert json.loads((out / "config.json").read_text()) == {
        "model": {"layers": 2, "d_model": 64},
        "seed": 2,  # run_config= wins over set_config() before it
        "lr": 3e-4,
        "batch": 16,
        "tags": ["a", "b"],
        "warmup": 20,
    }
    attrs = dict(spans.get_finished_spans()[0].resource.attributes)
    config = {k: v for k, v in attrs.items() if k.startswith("tunix.config.")}
    assert config == {
        "tunix.config.model.layers": 2,
        "tunix.config.model.d_model": 64,
        "tunix.config.seed": 2,
        "tunix.config.lr": 3e-4,
        "tunix.config.batch": 16,
    }  # the list is not a scalar; warmup came after the resource was made
    header = _rows(out / "spans.jsonl")[0]
    assert header["resource"]["tunix.config.lr"] == 3e-4
    # the next run starts from nothing; with no keys named, none go on the resource
    monkeypatch.delenv("OTEL_TUNIX_RESOURCE_CONFIG_KEYS")
    otel_tunix.configure(output_dir=tmp_path / "next", run_config={"lr": 1e-3})
    with otel_tunix.step(0), otel_tunix.component("work"):
        pass
    otel_tunix.shutdown()
    header = _rows(tmp_path / "next" / "spans.jsonl")[0]
    assert not any(k.startswith("tunix.config.") for k in header["resource"])
    assert json.loads((tmp_path / "next" / "config.json").read_text()) == {"lr": 1e-3}
    otel_tunix.configure(output_dir=tmp_path / "third")
    otel_tunix.shutdown()
    assert not (tmp_path / "third" / "config.json").exists()
    with pytest.raises(otel_tunix.ConfigurationError, match="run_config must be a dict"):
        otel_tunix.configure(output_dir="none", run_config=[("lr", 1)])  # type: ignore[arg-type]


def test_log_after_shutdown_says_after_shutdown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    otel_tunix.configure(output_dir=tmp_path / "run")
    otel_tunix.log({"loss": 1.0}, step=0)
    otel_tunix.shutdown()
    with caplog.at_level(logging.WARNING):
        otel_tunix.log({"loss": 2.0}, step=1)
        otel_tunix.log({"loss": 3.0}, step=2)
    said = [r.getMessage() for r in caplog.records if "otel_tunix.log()" in r.getMessage()]
    assert said == [
        "otel_tunix.log() was called after otel_tunix.shutdown(); nothing is logged until "
        "the next configure()"
    ]
    rows = _rows(tmp_path / "run" / "metrics.jsonl")
    logged = [r for r in rows if "loss" in r.get("metrics", {})]
    assert [r["step"] for r in logged] == [0]
