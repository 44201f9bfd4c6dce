"""Per-span cost of otel-tunix against the raw OTel SDK, Tunix's tracer and a bare loop.

Everything is measured in this one run and printed as ratios, since absolute numbers drift
between machines. Run: ``make bench`` (or ``.venv/bin/python bench/bench_overhead.py``).

Targets (issue #2):
* a component in a step that is not sampled: <= 0.5 us, and <= 0.1x an OTel SDK span under
  the ALWAYS_OFF sampler;
* a component in a sampled step, including otel-tunix's processors and a null exporter:
  <= 0.25x a raw OTel SDK span (ALWAYS_ON + BatchSpanProcessor to a null exporter), and no
  more than Tunix's ``PerfTracer.span`` when google-tunix is installed.

The sampled rows give the ten components of a step one name; the row "each component its
own name" gives each its own, as in a real step (each name then has its own per-step
metrics and span attributes: more work per component).

Tunix is measured twice: its bare span (what the target names; its spans are never
processed) and as its RL learners use it, with the per-step ``export()`` that does Tunix's
processing, to a null export function: the like-for-like pair of otel-tunix's sampled row.

Rows are measured in rounds (each round measures every row once; a row's value is its median
over the rounds), so a burst of load on this shared VM lands on all rows alike. The heap
matters: Python's garbage collector walks every tracked object at each full collection, and
the SDK's spans live long enough to trigger many. Importing google-tunix (for its row) loads
JAX, which makes the heap that of a real training process; ``--no-tunix`` measures a bare
process instead.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

import otel_tunix
from otel_tunix.pipeline.export_processor import BatchExportProcessor
from otel_tunix.testing import steps_set_aside


class NullExporter(SpanExporter):
    """Reads every span of a batch (its context, as any real exporter reads at least that)
    and drops them. Reading matters: otel-tunix builds a step's SDK spans as the exporter
    iterates over the batch, so an exporter that never looked at its batch would not pay
    for them, and the comparison with the SDK would flatter otel-tunix."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            span.context  # noqa: B018 - the read is the point
        return SpanExportResult.SUCCESS


class Rounds:
    """Samples of every row, taken in rounds: each round measures each row once, so a burst
    of load from a neighbour on this shared VM lands on all rows alike instead of on
    whichever row happened to run then. Each row's value is its median over the rounds."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.samples: dict[str, list[float]] = {}

    def take(self, row: str, fn: Callable[[int], float]) -> None:
        """One sample of ``row``: ``fn(n)`` seconds, in microseconds per span. Each sample
        starts from a full collection, so a row pays for the garbage collections its own
        objects trigger, not for a full collection that the previous rows' survivors had
        brought close (which row crossed the collector's threshold decided, before, whether
        Tunix's bare span read 3.4 us or 13 us)."""
        gc.collect()
        self.samples.setdefault(row, []).append(fn(self.n) / self.n * 1e6)

    def medians(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.samples.items()}

    def spreads(self) -> dict[str, tuple[float, float]]:
        return {k: (min(v), max(v)) for k, v in self.samples.items()}


def bare_clock(n: int) -> float:
    pc = time.perf_counter_ns
    t = time.perf_counter()
    for _ in range(n):
        pc()
        pc()
    return time.perf_counter() - t


def sdk_span(sampler: object, processor: bool) -> Callable[[int], float]:
    tp = TracerProvider(sampler=sampler)  # type: ignore[arg-type]
    if processor:
        tp.add_span_processor(BatchSpanProcessor(NullExporter(), max_queue_size=1 << 16))
    tracer = tp.get_tracer("bench")

    def run(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            with tracer.start_as_current_span("train_step_compute"):
                pass
        tp.force_flush()  # its export thread's work counts, as otel-tunix's processing does
        return time.perf_counter() - t

    return run


def tunix_span(per_step: int | None = None) -> Callable[[int], float] | None:
    """Tunix's tracer. ``per_step=None``: bare spans, as the issue's target names it (they
    pile up in the tracer's current step, never processed). With ``per_step``: as Tunix's RL
    learners use it, the pair of ours: each span tagged with its step and ``export()`` after
    every ``per_step`` spans (Tunix's per-step processing: it commits the step's timelines and
    calls the export function, here one that returns nothing: a null exporter). A fresh
    tracer per measurement: Tunix keeps every committed step and copies that list on each
    commit, so its cost per step grows with the run; a short run is the fair-to-Tunix case."""
    try:
        from tunix.perf.experimental.tracer import PerfTracer  # type: ignore[import-not-found]
    except Exception:
        return None

    def bare(n: int) -> float:
        tracer = PerfTracer()
        t = time.perf_counter()
        for _ in range(n):
            with tracer.span("train_step_compute"):
                pass
        return time.perf_counter() - t

    def as_used(n: int) -> float:
        assert per_step is not None
        tracer = PerfTracer(export_fn=lambda timelines: {})
        t = time.perf_counter()
        for s in range(max(1, n // per_step)):
            tags = {"step": s}
            for _ in range(per_step):
                with tracer.span("train_step_compute", tags=tags):
                    pass
            tracer.export()
        return time.perf_counter() - t

    return bare if per_step is None else as_used


def _loop(n: int, per_step: int, sampled: bool, distinct: bool = False) -> None:
    """``n`` components, ``per_step`` to a step (sampling_rate=2: even steps are sampled),
    all named ``train_step_compute`` or, ``distinct``, each its own name (as in a real step:
    each name has its own per-step metrics)."""
    component, step = otel_tunix.component, otel_tunix.step
    base = 0 if sampled else 1
    names = [f"component_{i}" if distinct else "train_step_compute" for i in range(per_step)]
    for s in range(max(1, n // per_step)):
        with step(2 * s + base):
            for name in names:
                with component(name):
                    pass


def unsampled_alone(n: int, name: str = "train_step_compute") -> float:
    """``n`` components in one step that is not sampled: the component alone, without the
    share of its step that the loop rows carry."""
    component = otel_tunix.component
    with otel_tunix.step(1):
        t = time.perf_counter()
        for _ in range(n):
            with component(name):
                pass
        return time.perf_counter() - t


def unsampled_badput_alone(n: int) -> float:
    """As :func:`unsampled_alone`, for a component of a badput category (a data wait): its
    stand-in times it for the goodput ledger (two clock reads and a dict update)."""
    return unsampled_alone(n, "train_data_load")


def ours_on_one_thread(per_step: int, provider: TracerProvider) -> Callable[[int], float]:
    """A diagnostic: the sampled loop, then the worker's processing of its steps and the
    export, all on the training thread (no thread hands the GIL to another). ``provider``
    holds otel-tunix's export processor with its thread kept asleep; its ``force_flush``
    exports on the calling thread."""

    def run(n: int) -> float:
        with steps_set_aside() as kept:
            t = time.perf_counter()
            _loop(n, per_step, sampled=True)
            kept.process()
            provider.force_flush()
            return time.perf_counter() - t

    return run


def ours(
    sampled: bool, per_step: int, processed: bool, distinct: bool = False
) -> Callable[[int], float]:
    """A loop of steps with ``per_step`` components (``distinct``: each its own name).
    ``processed``: the time includes the worker's processing and the export (flushed at the
    end); otherwise the finished steps are set aside and only the training thread's own cost
    is timed."""

    def loop(n: int) -> float:
        t = time.perf_counter()
        _loop(n, per_step, sampled, distinct)
        if processed:
            otel_tunix.force_flush()
        return time.perf_counter() - t

    def run(n: int) -> float:
        if processed:
            return loop(n)
        with steps_set_aside():
            return loop(n)

    return run


@contextlib.contextmanager
def configured(**configure: object) -> Iterator[None]:
    """otel-tunix configured for the block (sampling_rate=2, no local run folder), settled:
    its threads started and the previous run's garbage collected before anything is timed."""
    otel_tunix.configure(
        service_name="bench",
        output_dir="none",
        perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=2),
        **configure,  # type: ignore[arg-type]
    )
    try:
        gc.collect()
        time.sleep(0.05)
        yield
    finally:
        otel_tunix.shutdown()


def gc_off(fn: Callable[[int], float]) -> Callable[[int], float]:
    """``fn`` run with Python's garbage collector off (a diagnostic row)."""

    def run(n: int) -> float:
        gc.collect()
        gc.disable()
        try:
            return fn(n)
        finally:
            gc.enable()

    return run


def one_cpu(fn: Callable[[int], float]) -> Callable[[int], float]:
    """``fn`` run with the process's Python threads (the training thread and otel-tunix's
    worker and export threads) held on one CPU, the first the process may use (a diagnostic
    row: on this 2-vCPU VM, threads that hand the GIL to each other from two CPUs can cost
    more than the same threads taking turns on one). Linux only; elsewhere ``fn`` as is."""

    def run(n: int) -> float:
        if not hasattr(os, "sched_setaffinity"):
            return fn(n)
        ids = [t.native_id for t in threading.enumerate() if t.native_id is not None]
        before = {i: os.sched_getaffinity(i) for i in ids}
        cpu = {min(os.sched_getaffinity(0))}
        try:
            for i in ids:
                os.sched_setaffinity(i, cpu)
            return fn(n)
        finally:
            for i, cpus in before.items():
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    os.sched_setaffinity(i, cpus)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spans", type=int, default=20000, help="spans per measurement")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--per-step", type=int, default=10, help="components per step")
    ap.add_argument(
        "--no-tunix",
        action="store_true",
        help="skip Tunix's tracer and its import (JAX): a bare process with a small heap, "
        "where Python's garbage collector costs the SDK span much less",
    )
    args = ap.parse_args()
    n, r = args.spans, args.repeats
    # The step-time spike rule is on (it is part of the processing) but the bench's steps
    # are microseconds long and jitter: keep its console lines out of the table.
    logging.getLogger("otel_tunix.metrics.alerts").setLevel(logging.ERROR)
    # The same queue bound as the SDK processor below: at this rate nothing may be dropped
    # (dropped spans would cost nothing to export).
    os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(1 << 16)

    sdk_off, sdk_on = sdk_span(ALWAYS_OFF, False), sdk_span(ALWAYS_ON, True)
    # Importing google-tunix loads JAX: the heap then holds ~350k objects, as in a real
    # training process (torch alone: ~170k), and every full collection walks them all.
    tunix = None if args.no_tunix else tunix_span()
    tunix_used = None if args.no_tunix else tunix_span(args.per_step)
    print(f"objects tracked by the garbage collector: {len(gc.get_objects())}")
    # otel-tunix joining an application's provider whose exporter sits behind the SDK's
    # BatchSpanProcessor (which takes spans one at a time).
    app = TracerProvider()
    app.add_span_processor(BatchSpanProcessor(NullExporter(), max_queue_size=1 << 16))
    # otel-tunix's own export processor, with its thread asleep (never woken by a full
    # batch, an hour between scheduled exports): the one-thread diagnostic exports on the
    # training thread through its force_flush.
    one_thread = TracerProvider()
    one_thread.add_span_processor(
        BatchExportProcessor(
            NullExporter(), max_queue_size=1 << 22, max_export_batch_size=1 << 22,
            schedule_delay_millis=3_600_000,
        )
    )  # fmt: skip
    per = args.per_step
    rounds = Rounds(n)
    for i in range(r + 1):  # the first round warms up and is dropped
        if i == 1:
            rounds.samples.clear()
        rounds.take("bare clock pair", bare_clock)
        rounds.take("OTel SDK, ALWAYS_OFF", sdk_off)
        rounds.take("OTel SDK, ALWAYS_ON + batch(null)", sdk_on)
        if tunix is not None and tunix_used is not None:
            rounds.take("Tunix PerfTracer.span", tunix)
            rounds.take("Tunix, as its RL learner uses it (+ export() per step)", tunix_used)
        # otel-tunix as configured with an exporter of its own (OTEL_TRACES_EXPORTER or
        # span_exporters=): its processors, its batch processor, a null exporter. No local
        # run folder: file writing is an exporter of its own, measured by bench_demo.py.
        with configured(span_exporters=[NullExporter()]):
            rounds.take("otel-tunix, step not sampled", ours(False, per, False))
            rounds.take("  component alone, in one step not sampled", unsampled_alone)
            rounds.take("  badput component alone, timed, not sampled", unsampled_badput_alone)
            rounds.take("otel-tunix, sampled: training thread alone", ours(True, per, False))
            rounds.take("otel-tunix, sampled (+ processing)", ours(True, per, True))
            rounds.take("  same, each component its own name", ours(True, per, True, distinct=True))
            rounds.take("  same, garbage collector off (diagnostic)", gc_off(ours(True, per, True)))
            rounds.take("  same, threads on one CPU (diagnostic)", one_cpu(ours(True, per, True)))
            rounds.take(
                "  own names, threads on one CPU (diagnostic)",
                one_cpu(ours(True, per, True, distinct=True)),
            )
        with configured(tracer_provider=one_thread):
            rounds.take(
                "  same, every stage on the training thread (diagnostic)",
                ours_on_one_thread(per, one_thread),
            )
        with configured(tracer_provider=app):
            rounds.take(
                "  same, joined to an app provider + SDK batch(null)", ours(True, per, True)
            )
        # No span exporter at all (OTEL_TRACES_EXPORTER=none): no SDK span is built; what
        # is left is the accounting and the metrics (the local run folder's files come on
        # top).
        with configured():
            rounds.take("  same, no span exporter", ours(True, per, True))
            rounds.take(
                "  same, no span exporter, garbage collector off", gc_off(ours(True, per, True))
            )
    rows = rounds.medians()
    spreads = rounds.spreads()
    order = [
        "bare clock pair", "OTel SDK, ALWAYS_OFF", "OTel SDK, ALWAYS_ON + batch(null)",
        "otel-tunix, step not sampled", "  component alone, in one step not sampled",
        "  badput component alone, timed, not sampled",
        "otel-tunix, sampled: training thread alone",
        "otel-tunix, sampled (+ processing)", "  same, each component its own name",
        "  same, garbage collector off (diagnostic)",
        "  same, threads on one CPU (diagnostic)",
        "  own names, threads on one CPU (diagnostic)",
        "  same, every stage on the training thread (diagnostic)",
        "  same, joined to an app provider + SDK batch(null)", "  same, no span exporter",
        "  same, no span exporter, garbage collector off", "Tunix PerfTracer.span",
        "Tunix, as its RL learner uses it (+ export() per step)",
    ]  # fmt: skip
    rows = {k: rows[k] for k in order if k in rows}
    width = max(len(k) for k in rows)
    print(f"median of {r} rounds (each round measures every row once)")
    print(f"{'what':<{width}}  us/span   (min - max)")
    for k, v in rows.items():
        lo, hi = spreads[k]
        print(f"{k:<{width}}  {v:7.3f}   ({lo:.3f} - {hi:.3f})")
    off, on = rows["OTel SDK, ALWAYS_OFF"], rows["OTel SDK, ALWAYS_ON + batch(null)"]
    unsampled = rows["otel-tunix, step not sampled"]
    sampled = rows["otel-tunix, sampled (+ processing)"]
    print()
    print(f"unsampled / SDK ALWAYS_OFF        = {unsampled / off:.3f}  (target <= 0.1)")
    alone = rows["  component alone, in one step not sampled"]
    print(f"unsampled absolute                = {unsampled:.3f} us (target <= 0.5)")
    print(f"  component alone, without its step's share = {alone:.3f} us")
    timed = rows["  badput component alone, timed, not sampled"]
    print(
        f"  badput component alone (timed)  = {timed:.3f} us, / SDK ALWAYS_OFF = {timed / off:.3f}"
    )
    print(f"sampled+processing / SDK ALWAYS_ON = {sampled / on:.3f}  (target <= 0.25)")
    joined = rows["  same, joined to an app provider + SDK batch(null)"]
    print(f"  joined to an app's SDK batch     = {joined / on:.3f}")
    print(f"  no span exporter                 = {rows['  same, no span exporter'] / on:.3f}")
    hot = rows["otel-tunix, sampled: training thread alone"]
    print(f"sampled, training thread / SDK ON  = {hot / on:.3f}")
    if "Tunix PerfTracer.span" in rows:
        tunix = rows["Tunix PerfTracer.span"]
        print(f"sampled+processing / Tunix         = {sampled / tunix:.3f}  (target <= 1)")
        distinct = rows["  same, each component its own name"]
        print(f"  each component its own name / Tunix = {distinct / tunix:.3f}")
        pinned = rows["  same, threads on one CPU (diagnostic)"]
        print(f"  threads on one CPU / Tunix       = {pinned / tunix:.3f}")
        pinned = rows["  own names, threads on one CPU (diagnostic)"]
        print(f"  own names, threads on one CPU / Tunix = {pinned / tunix:.3f}")
        inline = rows["  same, every stage on the training thread (diagnostic)"]
        print(f"  every stage on one thread / Tunix = {inline / tunix:.3f}")
        used = rows["Tunix, as its RL learner uses it (+ export() per step)"]
        print(f"  / Tunix with its per-step export = {sampled / used:.3f}")
    else:
        print("Tunix PerfTracer.span: google-tunix not installed; ratio skipped")


if __name__ == "__main__":
    main()
