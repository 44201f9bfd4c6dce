"""The training metric names a real collector (rotel) receives from a real run: the SFT
demo's loop on its tiny transformer, exported over OTLP. The expected names are not written
here: they come from what the run itself logged (its ``metrics.jsonl``), looked up in the
catalog, so the test checks the whole way from a logged scalar to the name on the wire."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import otel_tunix
from otel_tunix.model.catalog import by_otel_name, lookup
from otel_tunix.model.metric_spec import MODE_ATTRIBUTE

pytest.importorskip("torch")

from otel_tunix.demos import sft as demo


def test_training_metrics_reach_the_collector_under_tunix_names(
    rotel_collector, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    otel_tunix.configure(service_name="names", output_dir=tmp_path, console_interval=0)
    cfg = demo.DemoConfig(
        steps=6, batch_size=4, seq_len=32, d_model=32, eval_every=3, eval_batches=1, workers=0
    )
    demo.train(cfg, run_dir=None)
    otel_tunix.shutdown()

    logged = {
        name
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        for name in json.loads(line).get("metrics", {})
    }
    # (instrument, mode) for every logged name the catalog files under tunix.training.*
    expected = set()
    for name in logged:
        m = lookup(name)
        if m is not None and m.spec.otel_name.startswith("tunix.training."):
            expected.add((m.spec.otel_name, m.attributes.get(MODE_ATTRIBUTE)))
    # Tunix's four, in both modes for the loss: the run logged what the test is about
    assert {
        ("tunix.training.loss", "train"), ("tunix.training.loss", "eval"),
        ("tunix.training.perplexity", "train"), ("tunix.training.learning_rate", "train"),
        ("tunix.training.gradient.norm", "train"),
    } <= expected  # fmt: skip

    out = rotel_collector.wait_for_metrics(*{name for name, _ in expected})
    received = {
        (m.name, p.attributes.get(MODE_ATTRIBUTE))
        for m in out.metrics
        if m.name.startswith("tunix.training.")
        for p in m.points
    }
    assert received == expected
    names = {m.name for m in out.metrics}
    assert not any(n.startswith(("tunix.train.", "tunix.eval.", "eval.")) for n in names), names
    for m in out.metrics:
        if m.name.startswith("tunix.training."):
            assert m.unit == by_otel_name(m.name).unit, m.name
            assert m.data_type.lower().startswith("gauge"), (m.name, m.data_type)
