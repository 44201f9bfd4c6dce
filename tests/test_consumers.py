"""One consumer interface: every consumer of finished steps is a ``StepSink`` in the worker's
list, none is reached through the SDK's private processor tuple, and what a consumer left
behind at shutdown had not been given is counted (issues #35 item 4, #36 cases 3 and 4)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from processes import child_env

import otel_tunix
from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.support import shortcuts as _shortcuts

MS = 1_000_000


class _Steps(StepSink):
    """A user's step sink: the step numbers it was given, and the outside spans."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, int]] = []
        self.outside: list[str] = []

    def on_step(self, summary: Any) -> None:
        self.steps.append((summary.scope, summary.step))

    def on_outside_spans(self, spans: Any) -> None:
        self.outside += [s.name for s in spans]


def _scripted_run(out: Path) -> dict[str, Any]:
    """A run on a clock of the test's own (so two runs are the same run): a restore
    before the loop, 20 training steps with a data wait and compute, a checkpoint in step
    10, an evaluation step every 5, a save after the loop; every kind of consumer (a user's
    sink, a plain SDK span processor, an exporter, the run folder). Returns its figures."""
    now = [0]

    def at(ms: float) -> None:
        now[0] += int(ms * MS)

    exported, seen, sink = InMemorySpanExporter(), InMemorySpanExporter(), _Steps()
    otel_tunix.configure(
        output_dir=out,
        clock=lambda: now[0],
        id_seed=5,
        system_metrics=False,
        span_exporters=[exported],
        span_processors=[SimpleSpanProcessor(seen)],
        step_sinks=[sink],
    )
    at(1)
    for n in range(20):
        with otel_tunix.step(n):
            with otel_tunix.component("data_wait", blocked=True):
                at(1)
            with otel_tunix.component("compute"):
                at(3)
            if n == 10:
                with otel_tunix.component("save", category="checkpoint_save"):
                    at(4)
        otel_tunix.log({"loss": 1.0 / (n + 1)}, step=n)
        if n % 5 == 4:
            with otel_tunix.step(n, scope="eval"), otel_tunix.component("evaluate"):
                at(2)
    with otel_tunix.component("final_save", category="checkpoint_save"):
        at(6)
    otel_tunix.shutdown()
    summary = json.loads((out / "summary.json").read_text())
    spans = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "scopes": summary["scopes"],
        "goodput": summary["goodput"],
        "counts": [summary[k] for k in ("dropped_steps", "failed_steps", "unprocessed_steps")],
        "export": summary["export"],
        "unfinished": summary["shutdown"]["unfinished"],
        "safety": summary["safety"],
        "spans.jsonl": [(x["type"], x.get("scope"), x.get("step")) for x in spans],
        # how many of each scalar at each step (the loop's and the worker's lines interleave
        # as the worker's batches fall)
        "metrics.jsonl": sorted(
            (m.get("step") or -1, name) for m in metrics for name in m.get("metrics", {})
        ),
        "exported": sorted(s.name for s in exported.get_finished_spans()),
        "span processor": sorted(s.name for s in seen.get_finished_spans()),
        "step sink": (sink.steps, sink.outside),
    }


def _gone(name: str) -> Callable[..., Any]:
    """What each private lookup answers where the private names are missing."""
    return {
        "span_processors_found": lambda provider: None,
        "span_processors_of": lambda provider: (provider,),
        "remove_span_processors": lambda provider, processors: None,
    }[name]


@pytest.mark.parametrize(
    "shortcut",
    ["span_processors_found", "span_processors_of", "remove_span_processors"],
)
def test_a_private_shortcut_gone_changes_none_of_the_runs_figures(
    shortcut: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = _scripted_run(tmp_path / "with")
    # the truth is the script's own: every step to every consumer
    steps = [("train", n) for n in range(20)] + [("eval", n) for n in range(4, 20, 5)]
    assert sorted(truth["step sink"][0]) == sorted(steps)
    assert truth["step sink"][1] == ["final_save"]
    assert sum(1 for t, *_ in truth["spans.jsonl"] if t == "step") == 24
    assert truth["goodput"]["badput_sec"]["checkpoint_save"] == pytest.approx(0.010)
    assert truth["goodput"]["badput_sec"]["data_stall"] == pytest.approx(0.020)
    assert truth["exported"] == truth["span processor"]
    assert truth["exported"].count("train_step") == 20
    # the lookup replaced, wherever otel-tunix imported it, by what it answers without them
    original = getattr(_shortcuts, shortcut)
    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "") or "").startswith("otel_tunix") and getattr(
            module, shortcut, None
        ) is original:
            monkeypatch.setattr(module, shortcut, _gone(shortcut))
    assert _scripted_run(tmp_path / "without") == truth


def test_a_processor_added_to_the_provider_by_hand_is_not_dropped_silently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the provider's processors cannot be read, one added to it by hand (not given
    to configure) cannot get otel-tunix's spans: a warning says so; those given do."""
    from otel_tunix.pipeline import step_sinks as consumers

    monkeypatch.setattr(consumers, "span_processors_found", _gone("span_processors_found"))
    given, by_hand = InMemorySpanExporter(), InMemorySpanExporter()
    otel_tunix.configure(output_dir="none", span_processors=[SimpleSpanProcessor(given)])
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(by_hand))  # type: ignore[attr-defined]
    with otel_tunix.step(0), otel_tunix.component("c"):
        pass
    otel_tunix.shutdown()
    assert [s.name for s in given.get_finished_spans()] == ["c", "train_step"]
    assert by_hand.get_finished_spans() == ()
    assert any("cannot be read" in r.getMessage() for r in caplog.records)


_HUNG_ON_END = r"""
import json, sys, time
import otel_tunix
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

class Counting(SimpleSpanProcessor):  # the steps whose every span on_end took
    steps = 0
    def on_end(self, span):
        super().on_end(span)
        if span.name == "train_step":
            Counting.steps += 1

exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{sys.argv[2]}/v1/traces", timeout=600)
otel_tunix.configure(output_dir=sys.argv[1], system_metrics=False,
                     span_processors=[Counting(exporter)])
t0 = time.monotonic()
for n in range(300):
    with otel_tunix.step(n), otel_tunix.component("work"):
        time.sleep(0.001)
loop = time.monotonic() - t0
t0 = time.monotonic()
otel_tunix.shutdown()
print(json.dumps({"loop_sec": loop, "shutdown_sec": time.monotonic() - t0,
                  "steps_on_end": Counting.steps}))
"""


def test_a_span_processor_that_blocks_in_on_end_loses_no_step_of_the_run_folder(
    tmp_path: Path, hung_collector: int
) -> None:
    """#36 case 3: a user's ``SimpleSpanProcessor`` over an OTLP exporter to a collector
    that never answers. Its ``on_end`` runs on a thread of its own: every step reaches
    ``spans.jsonl``; the processor is named as left behind, with the steps it did not get."""
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _HUNG_ON_END, str(run), str(hung_collector)],
        env=child_env(
            OTEL_TUNIX_SHUTDOWN_TIMEOUT="2",
            OTEL_TUNIX_PERFETTO_DIR="none",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    print(
        f"300 steps, a hung on_end: loop {got['loop_sec']:.2f} s, shutdown "
        f"{got['shutdown_sec']:.2f} s (budget 2 s)"
    )
    assert got["shutdown_sec"] < 2 + 1.0
    lines = [json.loads(x) for x in (run / "spans.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["type"] == "step"] == list(range(300))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dropped_steps"] == summary["unprocessed_steps"] == 0
    assert summary["scopes"][0]["steps"] == 300
    assert summary["shutdown"]["unfinished"] == ["span processor Counting (on_end)"]
    # every step the processor did not take whole is counted (it blocked in its first)
    assert summary["safety"]["hook_steps_not_delivered"] == 300 - got["steps_on_end"]
    assert summary["safety"]["hooks_unfinished"] == 1


class _Hangs:
    """Tunix's backend protocol: takes every scalar until one named ``hang``, then blocks
    (until ``release``), left behind by the shutdown."""

    def __init__(self) -> None:
        self.got = 0
        self.release = threading.Event()

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        if event == "hang":
            self.release.wait()
        self.got += 1

    def close(self) -> None:
        return None


def test_a_backend_left_behind_at_shutdown_has_the_scalars_it_did_not_get_counted(
    tmp_path: Path,
) -> None:
    """#36 case 4: what a backend left behind had not been given is counted in
    ``summary.json`` (``complete`` false), against the scalars the run's own
    ``metrics.jsonl`` holds."""
    backend = _Hangs()
    otel_tunix.configure(
        output_dir=tmp_path,
        system_metrics=False,
        metrics_logger=otel_tunix.MetricsLoggerOptions(
            log_dir=tmp_path, backend_factories=[lambda: backend]
        ),
    )
    for n in range(40):
        with otel_tunix.step(n), otel_tunix.component("work"):
            pass
        otel_tunix.log({"loss": 1.0, "lr": 0.1, "tokens": 512.0}, step=n)
        if n == 10:
            otel_tunix.log({"hang": 1.0}, step=n)
    try:
        otel_tunix.shutdown(timeout=1.0)
        got = backend.got  # frozen: the backend waits in "hang"
    finally:
        backend.release.set()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = sum(len(x["metrics"]) for x in lines if "metrics" in x)  # every backend's rows
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "backend _Hangs" in summary["shutdown"]["unfinished"]
    assert 0 < got < logged
    # Counted by the backend's calls: the MetricsLogger's thread hands it its rows in
    # batches, and the call it hangs in is counted whole (it took some of that call's rows
    # before it hung, and none after)
    not_delivered = summary["safety"]["hook_scalars_not_delivered"]
    assert logged - got <= not_delivered <= logged
    assert "hook_scalars_not_delivered" in summary["lost"] and not summary["complete"]


class _Slow:
    """Tunix's backend protocol, 5 ms a scalar (#36 case 4), counting what it took."""

    def __init__(self) -> None:
        self.got = 0

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        time.sleep(0.005)
        self.got += 1

    def close(self) -> None:
        return None


def test_a_slow_backend_left_behind_has_what_it_did_not_get_counted(tmp_path: Path) -> None:
    """#36 case 4 as measured: a 5 ms-a-call backend still behind when the shutdown's budget
    ends. What it had not taken is counted; the backend goes on meanwhile, so the count lies
    between what it lacked when the shutdown began and what it lacks after."""
    backend = _Slow()
    otel_tunix.configure(
        output_dir=tmp_path,
        system_metrics=False,
        metrics_logger=otel_tunix.MetricsLoggerOptions(
            log_dir=tmp_path, backend_factories=[lambda: backend]
        ),
    )
    for n in range(200):
        otel_tunix.log({f"m{i}": float(i) for i in range(10)}, step=n)
    before = backend.got
    otel_tunix.shutdown(timeout=0.5)
    after = backend.got
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = sum(len(x["metrics"]) for x in lines if "metrics" in x)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert logged >= 2000 and after < logged  # left behind, not finished
    assert "backend _Slow" in summary["shutdown"]["unfinished"]
    # (a call of 10 the backend was part-way through counts whole as not delivered)
    not_delivered = summary["safety"]["hook_scalars_not_delivered"]
    assert logged - after <= not_delivered <= logged - before + 10


def test_a_consumer_of_the_users_runs_on_a_thread_of_its_own_for_every_hook() -> None:
    """One generic wrapper: every hook of a user's consumer is called on its thread, in
    order, whatever the hook."""
    calls: list[tuple[str, str]] = []

    class Every(StepSink):
        def _note(self, hook: str) -> None:
            calls.append((hook, threading.current_thread().name))

        def on_finished_steps(self, steps: Any) -> None:
            self._note("on_finished_steps")

        def on_outside_spans(self, spans: Any) -> None:
            self._note("on_outside_spans")

        def on_session(self, sessions: Any) -> None:
            self._note("on_session")

        def close(self) -> None:
            self._note("close")

    otel_tunix.configure(output_dir="none", step_sinks=[Every()])
    with otel_tunix.step(0):
        pass
    with otel_tunix.component("between"):
        pass
    otel_tunix.shutdown()
    hooks = [hook for hook, _ in calls]
    assert hooks == ["on_finished_steps", "on_outside_spans", "on_session", "close"]
    threads = {thread for _, thread in calls}
    assert len(threads) == 2 and threading.current_thread().name not in threads
    assert all("Every" in thread for thread in threads)  # its calls, then its closing


@pytest.mark.parametrize("scope", [5, None, 2.5, ("a", 1)])
def test_a_scope_that_is_not_a_string_is_taken_as_its_string(
    scope: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """#35's table: five training steps, then ``step(0, scope=5)``, then the shutdown:
    no internal error, the train scope's session line kept, the scope named as its text."""
    otel_tunix.configure(output_dir=tmp_path, system_metrics=False)
    for n in range(5):
        with otel_tunix.step(n), otel_tunix.component("work"):
            pass
    with otel_tunix.step(0, scope=scope), otel_tunix.component("work"):  # type: ignore[arg-type]
        pass
    sessions = otel_tunix.shutdown()
    assert {s.scope: s.steps for s in sessions} == {"train": 5, str(scope): 1}
    lines = [json.loads(x) for x in (tmp_path / "spans.jsonl").read_text().splitlines()]
    assert sorted(x["scope"] for x in lines if x["type"] == "session") == sorted(
        ["train", str(scope)]
    )
    assert [x["scope"] for x in lines if x["type"] == "step"] == ["train"] * 5 + [str(scope)]
    assert any(
        f"scope={scope!r}" in r.getMessage() and "taken as" in r.getMessage()
        for r in caplog.records
    )


def test_span_processors_of_either_kind_are_not_consumers_twice() -> None:
    """A ``StepSpanProcessor`` given to ``configure`` takes the steps whole, once; a plain
    one gets their spans through ``on_end``, once."""
    from otel_tunix.consumers.step_accounting import StepSpanProcessor

    class Whole(StepSpanProcessor):
        def __init__(self) -> None:
            self.steps: list[int] = []
            self.ends: list[str] = []

        def on_finished_steps(self, steps: Any) -> None:
            self.steps += [s.number for s in steps]

        def on_end(self, span: Any) -> None:
            self.ends.append(span.name)

    class Plain(SpanProcessor):
        def __init__(self) -> None:
            self.ends: list[str] = []

        def on_end(self, span: Any) -> None:
            self.ends.append(span.name)

    whole, plain = Whole(), Plain()
    otel_tunix.configure(output_dir="none", span_processors=[whole, plain])
    for n in range(3):
        with otel_tunix.step(n), otel_tunix.component("c"):
            pass
    with trace.get_tracer(__name__).start_as_current_span("app"):  # other code's span
        pass
    otel_tunix.shutdown()
    assert whole.steps == [0, 1, 2]
    assert whole.ends == ["app"]
    assert sorted(plain.ends) == sorted(["app"] + ["c", "train_step"] * 3)
