"""One bad name costs nothing but its own cleaning: names and values with lone surrogates,
NUL, newlines or 10,000 characters reach a real collector (cleaned), with every other span
of their batch, and are counted."""

from __future__ import annotations

import json
from pathlib import Path

import otel_tunix

# name as given -> as it must arrive: control characters and lone surrogates become U+FFFD,
# a name is cut at 255 characters (its last one an ellipsis)
BAD_NAMES = {
    "bad\ud800name": "bad\ufffdname",
    "nul\x00name": "nul\ufffdname",
    "new\nline": "new\ufffdline",
    "x" * 10_000: "x" * 254 + "\u2026",
}


def test_bad_names_and_values_cost_no_span_of_their_batch(rotel_collector, monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    otel_tunix.configure(output_dir=tmp_path / "run", system_metrics=False)
    bad = list(BAD_NAMES)
    for n in range(200):
        with otel_tunix.step(n) as s:
            with otel_tunix.component("good"):
                pass
            if n % 10 == 3:  # 20 steps, five of each bad name
                with otel_tunix.component(bad[n // 10 % 4]) as c:
                    c.set_attribute("note\x00", "text \ud800 with\x00 NUL")
                s.set_attribute("tunix.note", "\udfff")
            if n == 7:
                try:
                    with otel_tunix.component("raises"):
                        raise ValueError("message \ud800")
                except ValueError:
                    pass
    otel_tunix.shutdown()
    out = rotel_collector.wait_for_span_counts({"train_step": 200, "good": 200}, timeout=20)
    received = {s.name for s in out.spans}
    assert set(BAD_NAMES.values()) <= received
    for given, clean in BAD_NAMES.items():
        spans = out.spans_named(clean)
        assert len(spans) == 5, (given[:10], len(spans))
        assert spans[0].attributes["tunix.component"] == clean
        assert spans[0].attributes["note\ufffd"] == "text \ufffd with\ufffd NUL"
    assert len(out.spans_named("raises")) == 1
    noted = [s for s in out.spans_named("train_step") if "tunix.note" in s.attributes]
    assert len(noted) == 20 and noted[0].attributes["tunix.note"] == "\ufffd"
    # the local files have every step, and say what was cleaned
    run = tmp_path / "run"
    lines = [json.loads(x) for x in (run / "spans.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step"]
    assert len(steps) == 200
    assert set(BAD_NAMES.values()) <= {c for x in steps for c in x["components"]}
    safety = json.loads((run / "summary.json").read_text())["safety"]
    assert safety["names_cleaned"] == 20  # the 20 spans with a bad name
    # per bad span its attribute key and value, per noted step its value, the exception
    assert safety["values_cleaned"] == 20 * 2 + 20


def test_a_bad_metric_name_is_logged_cleaned_once(tmp_path: Path) -> None:
    otel_tunix.configure(output_dir=tmp_path, system_metrics=False)
    for n in range(3):
        otel_tunix.log({"loss\n": 1.0, "kl\ud800": 0.5, "fine": 2.0}, step=n)
    otel_tunix.shutdown()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r["metrics"] for r in rows if "fine" in r.get("metrics", {})]
    assert logged == [{"loss\ufffd": 1.0, "kl\ufffd": 0.5, "fine": 2.0}] * 3
    assert json.loads((tmp_path / "summary.json").read_text())["safety"]["names_cleaned"] == 2
