"""The catalog table, and the catalog-driven OTel backend against a real in-memory reader."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_tunix import MetricsLogger, MetricsLoggerOptions
from otel_tunix.logger.instruments import CatalogOTelBackend
from otel_tunix.model.catalog import CATALOG, by_otel_name, guess_unit, lookup, markdown_table
from otel_tunix.model.metric_spec import E2E_LATENCY_BUCKETS, Instrument

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _points(reader: InMemoryMetricReader) -> dict[str, tuple[str, list]]:
    data = reader.get_metrics_data()
    out: dict[str, tuple[str, list]] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = (m.unit, list(m.data.data_points))
    return out


def test_no_two_metrics_collapse_into_one():
    otel = [(s.otel_name, tuple(sorted(s.attributes.items()))) for s in CATALOG]
    assert len(otel) == len(set(otel))
    # rows that share an instrument (Tunix's loss in modes train and eval) differ only in
    # their constant attributes, never in kind, unit or description
    for name in {s.otel_name for s in CATALOG}:
        shared = [s for s in CATALOG if s.otel_name == name]
        assert len({(s.instrument, s.unit, s.description, s.scale) for s in shared}) == 1, name
        assert len(shared) == 1 or all(s.attributes for s in shared), name
    logger_names = [s.logger_name for s in CATALOG if s.logger_name]
    assert len(logger_names) == len(set(logger_names))
    # the collision Tunix has: rewards/mean and advantages/mean both became "tunix.mean"
    assert lookup("rewards/mean").spec.otel_name == "tunix.rl.reward.mean"
    assert lookup("advantages/mean").spec.otel_name == "tunix.rl.advantage.mean"


def test_every_row_is_well_formed():
    for s in CATALOG:
        assert s.otel_name == s.otel_name.lower() and "/" not in s.otel_name, s
        assert s.unit and s.description and s.group, s
        if s.instrument is Instrument.HISTOGRAM:
            assert s.buckets and list(s.buckets) == sorted(s.buckets), s
        else:
            assert s.buckets is None, s
        if s.unit == "s" and s.instrument is Instrument.HISTOGRAM:
            assert s.buckets[0] <= 0.3, s  # seconds-shaped, not the SDK's millisecond default


def test_semconv_rows_match_the_semantic_conventions_package():
    pytest.importorskip("opentelemetry.semconv._incubating.metrics.hw_metrics")
    modules = {
        "hw": "hw_metrics", "gen_ai": "gen_ai_metrics", "process": "process_metrics",
        "system": "system_metrics",
    }  # fmt: skip
    for s in CATALOG:
        if not s.semconv:
            assert s.otel_name.startswith("tunix."), s
            continue
        mod = importlib.import_module(
            "opentelemetry.semconv._incubating.metrics." + modules[s.otel_name.split(".")[0]]
        )
        const = s.otel_name.upper().replace(".", "_")
        assert getattr(mod, const) == s.otel_name
        create = getattr(mod, "create_" + const.lower())
        meter = MeterProvider().get_meter("semconv-check")
        try:
            inst = create(meter, None)  # observable instruments take callbacks
        except TypeError:
            inst = create(meter)
        assert inst.unit == s.unit, s.otel_name
        kind = type(inst).__name__.lower().replace("_", "").replace("observable", "")
        assert kind == s.instrument.value, (s.otel_name, kind)


def test_lookup_patterns_and_units():
    m = lookup("rewards/format_reward")
    assert m is not None and m.spec.otel_name == "tunix.rl.reward.function"
    assert m.attributes == {"reward_fn": "format_reward"}
    assert lookup("rewards/a/b") is None  # a placeholder is one path segment
    assert lookup("my/own") is None
    assert by_otel_name("gen_ai.server.request.duration").buckets == E2E_LATENCY_BUCKETS
    assert guess_unit("eval/latency_sec") == "s"
    assert guess_unit("data/tokens") == "{token}"
    assert guess_unit("throughput_per_sec") == "1/s"
    assert guess_unit("accuracy") == "1"


def test_catalog_backend_records_on_the_catalogued_instruments():
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    logger = MetricsLogger(
        MetricsLoggerOptions(
            default_backends=False, backend_factories=[lambda: CatalogOTelBackend(mp)]
        ),
        rank=0,
    )
    logger.log_dict(
        {
            "rewards/mean": 0.5,
            "advantages/mean": -0.25,
            "rewards/format": 1.0,
            "tflops_per_step": 2.5,
            "actor_dequeue_time": 0.02,
            "eval/accuracy": 0.9,
            "tunix.rl.policy.kl": 3.0,  # a free-form name equal to a catalog instrument
        },
        step=3,
    )
    logger.log("actor_dequeue_time", math.nan, step=4)  # not recorded into the histogram
    logger.log("perf/train/step_time_sec", 1.0, step=4, source="perf")  # skipped
    assert logger.flush()  # the backends get the values on the logger's thread
    got = _points(reader)
    assert got["tunix.rl.reward.mean"][0] == "1"
    assert got["tunix.rl.reward.mean"][1][0].value == 0.5
    assert got["tunix.rl.advantage.mean"][1][0].value == -0.25
    fn = got["tunix.rl.reward.function"][1][0]
    assert fn.value == 1.0 and dict(fn.attributes) == {"reward_fn": "format"}
    assert got["tunix.training.flops_per_step"][0] == "{flop}"
    assert got["tunix.training.flops_per_step"][1][0].value == pytest.approx(2.5e12)
    hist = got["tunix.rl.actor.dequeue_time"]
    assert hist[0] == "s" and hist[1][0].count == 1 and hist[1][0].sum == pytest.approx(0.02)
    assert got["eval.accuracy"][1][0].value == 0.9
    assert got["tunix.logged.tunix.rl.policy.kl"][1][0].value == 3.0
    assert not any(name.startswith("perf") for name in got)


def test_docs_list_the_renames_to_tunix_names():
    text = DOCS.read_text()
    section = text.split("## Names shared with Tunix")[1].split("\n## ")[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) == 13
    for logger_name, before, now in rows:
        m = lookup(logger_name.strip("| `"))
        assert m is not None, logger_name
        new_name, *attrs = now.rstrip(" |").split(", ")
        assert new_name == f"`{m.spec.otel_name}`"
        assert [a.strip("`") for a in attrs] == [f"{k}={v}" for k, v in m.attributes.items()]
        old = before.split(" ")[0].strip("`")
        assert old.startswith(("tunix.train.", "tunix.eval.", "eval."))
        assert all(s.otel_name != old for s in CATALOG)
    # the four Tunix names (tunix/sft/metrics_logger.py, _OTEL_KNOWN_METRICS)
    tunix_named = ("loss", "perplexity", "learning_rate", "grad_norm")
    assert [lookup(n).spec.otel_name for n in tunix_named] == [
        "tunix.training.loss", "tunix.training.perplexity", "tunix.training.learning_rate",
        "tunix.training.gradient.norm",
    ]  # fmt: skip


def test_docs_table_lists_every_row():
    text = DOCS.read_text()
    for group in (
        "training",
        "rl",
        "generation",
        "gpu",
        "system",
        "alerts",
        "compilation",
        "goodput",
    ):
        assert markdown_table(group) in text, f"docs/metrics.md is stale for {group}"
    for s in CATALOG:
        assert f"`{s.otel_name}`" in text, s.otel_name
        if s.logger_name:
            assert f"`{s.logger_name}`" in text, s.logger_name
