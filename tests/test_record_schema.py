"""One record, written the same way everywhere (``otel_tunix.model.record``).

Each test runs a real run (spans JSONL, the Perfetto trace translated at shutdown, a real
rotel collector over OTLP on the fast path and on the SDK's path) and checks that every
destination says what the test did:

* a component's goodput category is the one it was recorded with, span by span, whether
  its steps are processed in one batch of the worker or in two (issue #35: the category was
  looked up by name when written, so step 0's span took step 1's category);
* a step number outside int64 costs at most its attribute, never the OTLP request, and
  never arrives wrapped (#36, case 1); ``otel-tunix summary`` reads it back;
* an exception whose ``__str__`` raises costs nothing but its text (#36, case 2);
* an error in a step's body with no component open reaches the spans JSONL, the Perfetto
  trace and ``otel-tunix summary`` (#36, case 5).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from collector import DebugSpan, RotelCollector
from exporters.test_perfetto import TraceView, load

import otel_tunix
from otel_tunix.accounting import categories
from otel_tunix.analysis.breakdown import summarize
from otel_tunix.cli import main as cli_main
from otel_tunix.model.record import SpanInfo, read_step_line
from otel_tunix.settings import attributes as attr

pytest.importorskip("perfetto")

INT64_MAX = 2**63 - 1
clock = time.perf_counter_ns


@dataclass
class Run:
    """What one run left: its spans JSONL lines, the collector's spans, the run folder's
    Perfetto trace (translated at shutdown)."""

    lines: list[dict[str, Any]]
    received: list[DebugSpan]
    trace: TraceView
    folder: Path

    def steps(self) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("type") == "step"]


@pytest.fixture
def declarations() -> Iterator[None]:
    """Declarations are the process's: start from none, put them back after."""
    before = dict(categories._declared)
    categories._declared.clear()
    categories.classify.cache_clear()
    yield
    categories._declared.clear()
    categories._declared.update(before)
    categories.classify.cache_clear()


@pytest.fixture
def record_run(
    rotel_collector: RotelCollector,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    declarations: None,
) -> Callable[..., Run]:
    """Runs ``workload`` in a configured run (``fast``: the OTLP fast path) and collects
    what each destination got, once the collector has ``expect`` spans of each name."""

    def run(
        workload: Callable[[], None], *, fast: bool, expect: dict[str, int], interval_ms: int
    ) -> Run:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
        monkeypatch.setenv("OTEL_TUNIX_OTLP_FAST_PATH", "true" if fast else "false")
        monkeypatch.setenv("OTEL_TUNIX_PROCESS_INTERVAL_MS", str(interval_ms))
        otel_tunix.configure(service_name="record-schema", output_dir=tmp_path / "runs")
        try:
            workload()
        finally:
            otel_tunix.shutdown()
        out = rotel_collector.wait_for_span_counts(expect)
        (spans_path,) = (tmp_path / "runs").rglob("spans*.jsonl")
        lines = [json.loads(line) for line in spans_path.read_text().splitlines()]
        (trace_path,) = spans_path.parent.glob("trace*.pftrace")
        return Run(lines, out.spans, load(trace_path.read_bytes()), spans_path.parent)

    return run


# --- each span its own category ---------------------------------------------------------------


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "sdk-path"])
@pytest.mark.parametrize("batches", ["one-batch", "two-batches"])
def test_each_component_keeps_the_category_it_was_recorded_with(
    record_run: Callable[..., Run], fast: bool, batches: str, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded: dict[int, str] = {}  # step -> the category given (the test's bookkeeping)
    inner: dict[str, int] = {}  # category -> ns the test measured inside its components
    outer: dict[str, int] = {}  # category -> ns the test measured around them

    def workload() -> None:
        for n, category in enumerate(("evaluation", "checkpoint_save", "evaluation")):
            with otel_tunix.step(n):
                t0 = clock()
                with otel_tunix.component("phase", category=category):
                    t1 = clock()
                    time.sleep(0.002)
                    t2 = clock()
                t3 = clock()
            recorded[n] = category
            inner[category] = inner.get(category, 0) + t2 - t1
            outer[category] = outer.get(category, 0) + t3 - t0
            if batches == "two-batches":
                otel_tunix.force_flush()  # each step processed in a batch of its own

    # One batch: the worker wakes only when the run flushes at its end (a minute apart).
    interval = 60_000 if batches == "one-batch" else 250
    run = record_run(workload, fast=fast, expect={"phase": 3}, interval_ms=interval)

    # spans.jsonl, read back through the schema
    by_step = {}
    for line in run.steps():
        (info,) = read_step_line(line).spans
        by_step[line["step"]] = info.category
    assert by_step == recorded
    # the collector
    phases = [s for s in run.received if s.name == "phase"]
    got = {s.attributes[attr.STEP]: s.attributes[attr.GOODPUT_CATEGORY] for s in phases}
    assert got == recorded
    # Perfetto (translated from spans.jsonl at shutdown)
    slices = sorted(run.trace.named("phase"), key=lambda s: s.start)
    assert [s.args[attr.GOODPUT_CATEGORY] for s in slices] == [recorded[n] for n in range(3)]
    # the ledgers, offline and live (summary.json), count each component's time in its own
    # category: between what the test measured inside and around those components
    capsys.readouterr()
    assert cli_main(["goodput", str(run.folder), "--json"]) == 0
    offline = json.loads(capsys.readouterr().out)["badput_sec"]
    live = json.loads((run.folder / "summary.json").read_text())["goodput"]["badput_sec"]
    for category in ("evaluation", "checkpoint_save"):
        assert inner[category] * 1e-9 <= offline[category] <= outer[category] * 1e-9
        assert inner[category] * 1e-9 <= live[category] <= outer[category] * 1e-9


def test_a_kept_component_without_a_category_takes_the_one_declared_when_recorded(
    declarations: None, tmp_path: Path
) -> None:
    """A name declared later does not rewrite what was recorded before."""
    otel_tunix.configure(service_name="record-schema", output_dir=tmp_path / "runs")
    try:
        with otel_tunix.step(0), otel_tunix.component("sync_state"):
            pass
        categories.declare("sync_state", "weight_sync")
        with otel_tunix.step(1), otel_tunix.component("sync_state"):
            pass
    finally:
        otel_tunix.shutdown()
    (spans_path,) = (tmp_path / "runs").rglob("spans*.jsonl")
    lines = [json.loads(line) for line in spans_path.read_text().splitlines()]
    got = [read_step_line(line).spans[0].category for line in lines if line["type"] == "step"]
    assert got == [None, "weight_sync"]


# --- #36 case 1: step numbers outside int64 -------------------------------------------------


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "sdk-path"])
def test_step_numbers_outside_int64_cost_only_their_attribute(
    record_run: Callable[..., Run], fast: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    numbers = [0, 2**63, 2**64 + 5, -(2**63) - 1, 7]

    def workload() -> None:
        for n in numbers:
            with otel_tunix.step(n), otel_tunix.component("compute"):
                pass

    run = record_run(
        workload, fast=fast, expect={"compute": len(numbers), "train_step": 5}, interval_ms=250
    )
    steps = [s for s in run.received if s.name == "train_step"]
    assert len(steps) == len(numbers)  # the request was not lost
    # In int64: as given; outside it: no tunix.step (as the SDK's encoder drops it), never
    # a wrapped value.
    assert sorted(s.attributes[attr.STEP] for s in steps if attr.STEP in s.attributes) == [0, 7]
    assert len([s for s in run.received if s.name == "compute"]) == len(numbers)
    # every step line is in the file, and summary reads them
    assert sorted(line["step"] for line in run.steps()) == sorted(numbers)
    capsys.readouterr()
    assert cli_main(["summary", str(run.folder)]) == 0
    assert "OverflowError" not in capsys.readouterr().err


# --- #36 case 2: an exception whose __str__ raises -------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "sdk-path"])
def test_an_exception_that_cannot_be_printed_costs_only_its_text(
    record_run: Callable[..., Run], fast: bool
) -> None:
    def workload() -> None:
        for n in range(4):
            expected = pytest.raises(Unprintable) if n == 1 else contextlib.nullcontext()
            with expected, otel_tunix.step(n), otel_tunix.component("compute"):
                if n == 1:
                    raise Unprintable

    run = record_run(workload, fast=fast, expect={"compute": 4, "train_step": 4}, interval_ms=250)
    assert sorted(line["step"] for line in run.steps()) == [0, 1, 2, 3]
    (bad,) = [line for line in run.steps() if line["step"] == 1]
    text = "Unprintable: <unprintable Unprintable object>"
    assert read_step_line(bad).spans[0].error == text
    assert read_step_line(bad).error == text
    failed = [s for s in run.received if s.name == "compute" and s.attributes[attr.STEP] == 1]
    assert [s.status_message for s in failed] == [text]


# --- #36 case 5: an error in a step's body, no component open ---------------------------------


def test_an_error_in_a_step_with_no_component_open_reaches_every_output(
    record_run: Callable[..., Run],
) -> None:
    def workload() -> None:
        with otel_tunix.step(0), otel_tunix.component("compute"):
            pass
        with pytest.raises(KeyError), otel_tunix.step(1):
            raise KeyError("batch")

    run = record_run(workload, fast=True, expect={"train_step": 2}, interval_ms=250)
    errors = {line["step"]: read_step_line(line).error for line in run.steps()}
    assert errors == {0: None, 1: "KeyError: 'batch'"}
    (failed,) = [s for s in run.received if s.name == "train_step" and s.status_message]
    assert failed.attributes[attr.STEP] == 1
    step0, step1 = sorted(run.trace.named("train_step"), key=lambda s: s.start)
    assert "error" not in step0.args
    assert step1.args["error"] == "KeyError: 'batch'"
    (train,) = summarize(run.folder).scopes
    assert (train.failed_steps, train.last_error) == (1, "KeyError: 'batch'")


# --- the schema itself ----------------------------------------------------------------------


def test_a_span_entry_reads_back_as_written() -> None:
    info = SpanInfo(
        "load",
        "blocked",
        10,
        30,
        "MainThread",
        7,
        "a" * 16,
        "b" * 16,
        "E: x",
        {"k": 1},
        "data_stall",
    )
    assert SpanInfo.from_json(json.loads(json.dumps(info.to_json()))) == info
    # hostile values: defaults, never an exception
    odd = SpanInfo.from_json({"start_ns": float("nan"), "end_ns": 2**70, "kind": 3})
    assert (odd.start_ns, odd.end_ns, odd.kind) == (0, INT64_MAX, "busy")
