"""What exporting over OTLP to a real collector costs the trainer process (issue #30).

A real rotel collector (blackhole exporter, counting what it receives) listens on loopback.
Each row is a fresh Python process that runs the issue's loop: steps of 10 components, one
step every 4 ms, then flushes; it reports the CPU time of the whole process (every thread)
over the loop and the flush, after a warm-up of a tenth as many steps (connections made,
caches filled: one-off costs that a run of hours spreads over millions of spans) and a full
garbage collection. A row's figure is that CPU over the bare loop's, per span; rows are
measured in interleaved rounds and each figure is the median over the rounds (this VM is
shared). Every span a row sends, warm-up included, is counted at the collector.

Rows, for each protocol (gRPC, HTTP/protobuf):
* ``SDK``: the OTel SDK's OTLP path: ``BatchSpanProcessor`` + ``OTLPSpanExporter``, one SDK
  span per step and component;
* ``otel-tunix``: ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, the fast path (default);
* ``otel-tunix, SDK exporter``: the same with ``OTEL_TUNIX_OTLP_FAST_PATH=false``.
And ``otel-tunix, no exporter`` (the processing without export).

Target: otel-tunix's CPU per span <= 0.2x the SDK's, every span arriving.

The GIL rows: a CPU-bound pure-Python step (10 components, ~4 ms of Python arithmetic),
run back to back, with and without the OTLP export; the median step time of each, so any
time the export thread holds the GIL shows as a longer step. Target: the ratio ~1.

The metric rows (OTLP/gRPC to a second rotel collector, which prints every data point it
receives): otel-tunix with ``OTEL_METRICS_EXPORTER=otlp`` exporting every second
(``OTEL_METRIC_EXPORT_INTERVAL``; 60 s by default), against the same run without metric
export; the same with ``OTEL_TUNIX_METRICS_FAST_PATH=false`` (the step histograms through
the SDK's instruments); and the SDK recording the same histograms (one value per step and
component, the attributes otel-tunix gives them) through its own instruments and OTLP
metric exporter. Each row counts the data points its exporter sent; the collector must
receive as many, and its last ``tunix.step.duration`` point must count every step.

Target: otel-tunix's metrics <= 0.2x the SDK's, every point arriving.

The whole-process rows (issue #35; ``--only whole`` runs them alone): the case as a user runs
it. Each run is a fresh process that sets up (the SDK's OTLP/gRPC path, or
``otel_tunix.configure(output_dir="none")`` with ``OTEL_TRACES_EXPORTER=otlp``; alerts and
system metrics off), runs ``--whole-steps`` paced steps of 10 components with no warm-up,
shuts down and exits; its CPU is the whole process's (``getrusage(RUSAGE_CHILDREN)``: every
thread, start-up, set-up and shutdown included). A row's figure per round is that CPU less
the bare loop's run of the same round, per span; the ratio otel-tunix / SDK per round, and
its median over ``--whole-rounds`` (3). Target: <= 0.2, every span arriving.

Run: ``.venv/bin/python bench/bench_export.py`` (``--steps``, ``--rounds``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = 10
PERIOD_S = 0.004
SPANS_PER_STEP = COMPONENTS + 1


# --- the child: one row ------------------------------------------------------------------
def _busy(n: int) -> int:
    x = 0
    for i in range(n):
        x += i * i & 7
    return x


def _loop(steps: int, step: Any, component: Any, cpu_bound: int) -> list[tuple[float, float]]:
    """The issue's loop; returns each step's start and end (``perf_counter``)."""
    names = [f"phase_{i}" for i in range(COMPONENTS)]
    times = []
    t0 = time.perf_counter()
    for n in range(steps):
        s = time.perf_counter()
        with step(n):
            for name in names:
                with component(name):
                    if cpu_bound:
                        _busy(cpu_bound)
        times.append((s, time.perf_counter()))
        if not cpu_bound:  # paced: one step every 4 ms
            wait = t0 + (n + 1) * PERIOD_S - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
    return times


def child(mode: str, steps: int, cpu_bound: int) -> dict[str, Any]:
    import contextlib

    flush: Any = None
    close: Any = None  # after the measurement: the last metric export, counted with the rest
    batches: list[tuple[float, float, float]] = []
    exported: dict[str, int] = {"points": 0, "steps": 0}
    if os.environ.get("OTEL_METRICS_EXPORTER") == "otlp":
        _count_metric_exports(exported)
    if mode == "bare":

        def step(n: int) -> Any:
            return contextlib.nullcontext()

        component = step
    elif mode.startswith("sdk"):
        step, component, flush, _ = _sdk_tracing()
        if mode == "sdk-metrics":
            step, component, flush, close = _sdk_metrics()
    else:
        import otel_tunix

        _time_export_batches(batches)
        otel_tunix.configure(output_dir="none")
        step, component, flush = otel_tunix.step, otel_tunix.component, otel_tunix.force_flush
        close = otel_tunix.shutdown
    # Warm up: connections made, caches filled, lazy imports done (one-off costs, which a
    # run of hours spreads over millions of spans), then measure.
    _loop(max(10, steps // 10), step, component, cpu_bound)
    if flush is not None:
        flush()
    batches.clear()
    gc.collect()  # every row starts from a full collection (see bench_overhead.py)
    threads0 = _thread_cpu()
    c0 = time.process_time()
    times = _loop(steps, step, component, cpu_bound)
    if flush is not None:
        flush()
    cpu = time.process_time() - c0
    threads1 = _thread_cpu()
    durations = sorted(e - s for s, e in times)
    # the steps during which the export thread was handling a batch
    during = [e - s for s, e in times if any(bs < e and s < be for bs, be, _ in batches)]
    if close is not None:
        close()
    return {
        "cpu_s": cpu,
        "step_s": statistics.median(durations),
        "step_p99_s": durations[int(len(durations) * 0.99)],
        "step_during_export_s": statistics.median(during) if during else None,
        "steps_during_export": len(during),
        "spans": steps * SPANS_PER_STEP,
        "batch_cpu_s": max((c for _, _, c in batches), default=0.0),
        "threads": {k: v - threads0.get(k, 0.0) for k, v in threads1.items()},
        "sent": (steps + max(10, steps // 10)) * SPANS_PER_STEP,
        "steps_sent": steps + max(10, steps // 10),
        "points_sent": exported["points"],
        "steps_counted": exported["steps"],
    }


def _sdk_tracing() -> tuple[Any, Any, Any, Any]:
    """The OTel SDK's OTLP path: ``BatchSpanProcessor`` + ``OTLPSpanExporter`` (the protocol
    of ``OTEL_EXPORTER_OTLP_PROTOCOL``); the loop's step and component, flush and shutdown."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    tp = TracerProvider(resource=Resource.create())
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    tracer = tp.get_tracer("bench")

    def step(n: int) -> Any:
        return tracer.start_as_current_span("train_step", attributes={"tunix.step": n})

    def component(name: str) -> Any:
        return tracer.start_as_current_span(name)

    return step, component, tp.force_flush, tp.shutdown


def whole_child(mode: str, steps: int) -> dict[str, Any]:
    """A run as a user runs it: set up, the paced loop (no warm-up), shut down; the CPU of
    the whole process at each point (``os.times``: every thread), start-up included."""
    import contextlib

    def cpu() -> float:
        t = os.times()
        return float(t.user + t.system)

    started = cpu()  # the interpreter's start-up
    close: Any = None
    if mode == "bare":

        def step(n: int) -> Any:
            return contextlib.nullcontext()

        component = step
    elif mode == "sdk":
        step, component, _, close = _sdk_tracing()
    else:
        import otel_tunix

        otel_tunix.configure(output_dir="none")
        step, component, close = otel_tunix.step, otel_tunix.component, otel_tunix.shutdown
    ready = cpu()
    _loop(steps, step, component, 0)
    looped = cpu()
    if close is not None:
        close()
    ended = cpu()
    return {
        "start_s": started,
        "setup_s": ready - started,
        "loop_s": looped - ready,
        "shutdown_s": ended - looped,
        "spans": steps * SPANS_PER_STEP,
        "sent": steps * SPANS_PER_STEP,
    }


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, by name (Linux; else nothing)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(tid), "native threads")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _time_export_batches(out: list[tuple[float, float, float]]) -> None:
    """Note when each export batch was handled (start, end) and its CPU time on the export
    thread (encoding and sending: the most it can hold the GIL, which the send releases)."""
    from otel_tunix.pipeline.export_processor import BatchExportProcessor

    export_batch = BatchExportProcessor._export_batch

    def timed(self: Any, items: Any) -> None:
        t, s = time.thread_time(), time.perf_counter()
        export_batch(self, items)
        out.append((s, time.perf_counter(), time.thread_time() - t))

    BatchExportProcessor._export_batch = timed  # type: ignore[method-assign]


def _count_metric_exports(out: dict[str, int]) -> None:
    """Count the data points that the OTLP metric exporter sent, and the steps that the
    last ``tunix.step.duration`` points count (cumulative: every step so far)."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    export = OTLPMetricExporter.export

    def counted(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        result = export(self, data, *args, **kwargs)
        if result is MetricExportResult.SUCCESS:
            for rm in data.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out["points"] += len(m.data.data_points)
                        if m.name == "tunix.step.duration":
                            out["steps"] = sum(p.count for p in m.data.data_points)
        return result

    OTLPMetricExporter.export = counted  # type: ignore[method-assign]


def _sdk_metrics() -> tuple[Any, Any, Any, Any]:
    """The SDK recording what otel-tunix's instruments record per step and component
    (step time, busy / blocked / idle per step; busy time per component: otel-tunix records
    a blocked time only where there is one), exported over OTLP by its periodic reader."""
    import contextlib

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    if os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
            OTLPMetricExporter,
        )
    mp = MeterProvider(
        resource=Resource.create(),
        metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())],
    )
    meter = mp.get_meter("bench")
    per_step = [meter.create_histogram(n, unit="s") for n in
                ("tunix.step.duration", "tunix.step.busy_time", "tunix.step.blocked_time",
                 "tunix.step.idle_time")]  # fmt: skip
    busy = meter.create_histogram("tunix.component.busy_time", unit="s")
    pc = time.perf_counter

    @contextlib.contextmanager
    def step(n: int) -> Any:
        s = pc()
        yield
        d = pc() - s
        for h in per_step:
            h.record(d, {"scope": "train"})

    @contextlib.contextmanager
    def component(name: str) -> Any:
        s = pc()
        yield
        busy.record(pc() - s, {"scope": "train", "component": name})  # never blocked

    return step, component, mp.force_flush, mp.shutdown


# --- the parent: rows, rounds, the collector ---------------------------------------------
# fmt: off
ROWS: dict[str, dict[str, str]] = {
    "bare loop": {"MODE": "bare"},
    "otel-tunix, no exporter": {"MODE": "tunix"},
    "grpc: SDK (BatchSpanProcessor + OTLPSpanExporter)": {"MODE": "sdk", "P": "grpc"},
    "grpc: otel-tunix": {"MODE": "tunix", "P": "grpc", "T": "otlp"},
    "grpc: otel-tunix, SDK exporter": {"MODE": "tunix", "P": "grpc", "T": "otlp", "F": "0"},
    "http: SDK (BatchSpanProcessor + OTLPSpanExporter)": {"MODE": "sdk", "P": "http/protobuf"},
    "http: otel-tunix": {"MODE": "tunix", "P": "http/protobuf", "T": "otlp"},
    "http: otel-tunix, SDK exporter": {
        "MODE": "tunix",
        "P": "http/protobuf",
        "T": "otlp",
        "F": "0",
    },
    "metrics: otel-tunix, OTLP every 1 s": {"MODE": "tunix", "P": "grpc", "M": "otlp"},
    "metrics: otel-tunix, SDK instruments, OTLP every 1 s": {"MODE": "tunix", "P": "grpc",
                                                             "M": "otlp", "MF": "0"},
    "metrics: SDK histograms, OTLP every 1 s": {"MODE": "sdk-metrics", "P": "grpc", "M": "otlp"},
    "gil: CPU-bound step, otel-tunix, no exporter": {"MODE": "tunix"},
    "gil: CPU-bound step, otel-tunix + OTLP/gRPC": {"MODE": "tunix", "P": "grpc", "T": "otlp"},
    "gil: CPU-bound step, otel-tunix + OTLP/HTTP": {"MODE": "tunix", "P": "http/protobuf",
                                                    "T": "otlp"},
}
# fmt: on


def _env(row: dict[str, str], collector: Any, metrics: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(
        OTEL_TUNIX_QUIET="true",
        OTEL_TUNIX_SYSTEM_METRICS_INTERVAL="0",
        OTEL_TUNIX_ALERTS="false",
        OTEL_TRACES_EXPORTER=row.get("T", "none"),
        OTEL_METRICS_EXPORTER=row.get("M", "none"),
        OTEL_LOGS_EXPORTER="none",
        OTEL_METRIC_EXPORT_INTERVAL="1000",
        OTEL_SERVICE_NAME="bench-export",
    )
    if "P" in row:
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = row["P"]
        grpc = row["P"] == "grpc"
        to = metrics if "M" in row else collector
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = to.grpc_endpoint if grpc else to.http_endpoint
    if row.get("F") == "0":
        env["OTEL_TUNIX_OTLP_FAST_PATH"] = "false"
    if row.get("MF") == "0":
        env["OTEL_TUNIX_METRICS_FAST_PATH"] = "false"
    return env


_RECEIVED = re.compile(r"Received traces\..*? spans=(\d+)")


def _received(collector: Any) -> int:
    return sum(int(m) for m in _RECEIVED.findall(collector.output()))


def _wait_received(collector: Any, at_least: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    got = _received(collector)
    while got < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
        got = _received(collector)
    time.sleep(0.1)  # anything more (a duplicate) would show too
    return _received(collector)


def _points(collector: Any) -> tuple[int, int]:
    """Data points the metrics collector received so far, and the steps that the last
    ``tunix.step.duration`` points count."""
    from collector import parse_debug_output  # the tests' parser of rotel's debug log

    got = parse_debug_output(collector.output()).metrics
    steps = next((sum(p.count or 0 for p in m.points) for m in reversed(got)
                  if m.name == "tunix.step.duration"), 0)  # fmt: skip
    return sum(len(m.points) for m in got), steps


def _wait_points(collector: Any, at_least: int, timeout: float = 10.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while _points(collector)[0] < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    return _points(collector)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=2000, help="steps per row and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--cpu-work", type=int, default=12000, help="loop length of a CPU-bound component"
    )
    ap.add_argument("--only", help="run only the rows whose name contains this (and the "
                    "bare loop and otel-tunix without exporter)")  # fmt: skip
    ap.add_argument(
        "--whole-steps", type=int, default=5000, help="steps of a run (--only whole: those alone)"
    )
    ap.add_argument("--whole-rounds", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--whole-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        cpu = args.cpu_work if os.environ.get("BENCH_CPU") == "1" else 0
        print(json.dumps(child(args.child, args.steps, cpu)))
        return
    if args.whole_child:
        print(json.dumps(whole_child(args.whole_child, args.whole_steps)))
        return
    if args.only == "whole":
        _whole(args)
        return

    sys.path.insert(0, str(ROOT / "tests"))
    from collector import RotelCollector  # the tests' rotel fixture

    log = Path(tempfile.mkdtemp(prefix="bench-export-")) / "rotel.log"
    rotel_args = ("--exporter", "blackhole", "--debug-log", "traces",
                  "--debug-log-verbosity", "basic")  # fmt: skip
    metrics_args = ("--exporter", "blackhole", "--debug-log", "metrics",
                    "--debug-log-verbosity", "detailed")  # fmt: skip
    samples: dict[str, list[dict[str, Any]]] = {}
    lost: dict[str, int] = {}
    lost_points: dict[str, int] = {}
    uncounted: dict[str, int] = {}
    base = ("bare loop", "otel-tunix, no exporter")
    rows = {k: v for k, v in ROWS.items() if not args.only or args.only in k or k in base}
    with (
        RotelCollector(log, args=rotel_args) as collector,
        RotelCollector(log.with_name("rotel-metrics.log"), args=metrics_args) as mcollector,
    ):
        for _ in range(args.rounds):
            for name, row in rows.items():
                env = _env(row, collector, mcollector)
                gil = name.startswith("gil:")
                if gil:
                    env["BENCH_CPU"] = "1"
                steps = max(10, args.steps // 10) if gil else args.steps
                before = _received(collector)
                points_before = _points(mcollector)[0]
                out = subprocess.run(
                    [sys.executable, __file__, "--child", row["MODE"], "--steps", str(steps),
                     "--cpu-work", str(args.cpu_work)],
                    env=env, capture_output=True, text=True, check=True,
                )  # fmt: skip
                result = json.loads(out.stdout.strip().splitlines()[-1])
                if row.get("T") == "otlp" or row["MODE"] == "sdk":
                    got = _wait_received(collector, before + result["sent"]) - before
                    lost[name] = lost.get(name, 0) + result["sent"] - got
                if row.get("M") == "otlp":
                    want = points_before + result["points_sent"]
                    points, counted = _wait_points(mcollector, want)
                    lost_points[name] = lost_points.get(name, 0) + want - points
                    missed = result["steps_sent"] - counted  # the collector's last count
                    uncounted[name] = uncounted.get(name, 0) + abs(missed)
                samples.setdefault(name, []).append(result)

    def cpu_us(name: str) -> float:
        per = [r["cpu_s"] / r["spans"] * 1e6 for r in samples[name]]
        return statistics.median(per)

    bare = cpu_us("bare loop")
    print(
        f"median of {args.rounds} rounds; {args.steps} steps of {COMPONENTS} components, one "
        f"every {PERIOD_S * 1e3:g} ms; CPU of the trainer process over the bare loop"
    )
    width = max(map(len, rows))
    print(f"{'row':<{width}}  us/span  (min - max)")
    for name in rows:
        if name.startswith("gil:") or name == "bare loop":
            continue
        per = [r["cpu_s"] / r["spans"] * 1e6 - bare for r in samples[name]]
        note = f"  lost at the collector: {lost[name]}" if name in lost else ""
        if name in lost_points:
            note = (f"  points lost at the collector: {lost_points[name]}, steps not "
                    f"counted: {uncounted[name]}")  # fmt: skip
        print(f"{name:<{width}}  {cpu_us(name) - bare:7.2f}  "
              f"({min(per):.2f} - {max(per):.2f}){note}")  # fmt: skip
    print()
    if not args.only:
        _span_ratios(cpu_us, bare, lost)
        _gil(samples)
    if "metrics: otel-tunix, OTLP every 1 s" in rows:
        none = cpu_us("otel-tunix, no exporter") - bare
        m_ours = cpu_us("metrics: otel-tunix, OTLP every 1 s") - bare - none
        m_old = cpu_us("metrics: otel-tunix, SDK instruments, OTLP every 1 s") - bare - none
        m_sdk = cpu_us("metrics: SDK histograms, OTLP every 1 s") - bare
        print(
            f"metrics: otel-tunix's OTLP metrics = {m_ours:.2f} us/span ({m_old:.2f} with the "
            f"SDK's instruments); the SDK recording and exporting the same = {m_sdk:.2f} "
            f"us/span; otel-tunix / SDK = {m_ours / m_sdk:.3f}  (target <= 0.2); with the "
            f"SDK's instruments {m_old / m_sdk:.3f}"
        )
        print(
            f"metric points lost at the collector, all rows: {sum(lost_points.values())}; "
            f"steps its last tunix.step.duration did not count: {sum(uncounted.values())}  "
            "(target 0)"
        )
    if not args.only:
        print()
        _whole(args)


WHOLE_ROWS: dict[str, dict[str, str]] = {
    "bare loop": {"MODE": "bare"},
    "grpc: SDK (BatchSpanProcessor + OTLPSpanExporter)": {"MODE": "sdk", "P": "grpc"},
    "grpc: otel-tunix": {"MODE": "tunix", "P": "grpc", "T": "otlp"},
}


def _whole(args: Any) -> None:
    """The issue's case: each run a fresh process as a user runs it (set up, the paced loop,
    shut down, exit), its CPU from ``getrusage(RUSAGE_CHILDREN)`` (every thread, start-up
    and shutdown included), over the bare loop's, per span; the rows interleaved in rounds."""
    import resource

    sys.path.insert(0, str(ROOT / "tests"))
    from collector import RotelCollector  # the tests' rotel fixture

    log = Path(tempfile.mkdtemp(prefix="bench-export-whole-")) / "rotel.log"
    rotel_args = ["--exporter", "blackhole", "--debug-log", "traces"]
    rotel_args += ["--debug-log-verbosity", "basic"]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in WHOLE_ROWS}
    lost = dict.fromkeys(WHOLE_ROWS, 0)
    with RotelCollector(log, args=rotel_args) as collector:
        for _ in range(args.whole_rounds):
            for name, row in WHOLE_ROWS.items():
                before = _received(collector)
                usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                command = [sys.executable, __file__, "--whole-child", row["MODE"]]
                command += ["--whole-steps", str(args.whole_steps)]
                env = _env(row, collector, collector)
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                result["process_s"] = (usage1.ru_utime - usage0.ru_utime) + (
                    usage1.ru_stime - usage0.ru_stime
                )
                if row["MODE"] != "bare":
                    got = _wait_received(collector, before + result["sent"]) - before
                    lost[name] += result["sent"] - got
                runs[name].append(result)
    spans = args.whole_steps * SPANS_PER_STEP
    bare = runs["bare loop"]
    print(
        f"as a user runs it: {args.whole_steps} steps of {COMPONENTS} components, one every "
        f"{PERIOD_S * 1e3:g} ms, a fresh process per run, alerts and system metrics off, no "
        f"run folder; CPU of the whole process (every thread, start-up and shutdown "
        f"included) over the bare loop's run of the same round; median of "
        f"{args.whole_rounds} rounds"
    )
    print(f"{'row':<52} us/span  (min - max)  set-up s  loop us/span  shutdown s  lost")
    per: dict[str, list[float]] = {}
    for name in WHOLE_ROWS:
        if name == "bare loop":
            continue
        rs = runs[name]
        pairs = list(zip(rs, bare, strict=True))
        per[name] = [(r["process_s"] - b["process_s"]) / spans * 1e6 for r, b in pairs]
        setup = statistics.median(r["setup_s"] - b["setup_s"] for r, b in pairs)
        loop = statistics.median((r["loop_s"] - b["loop_s"]) / spans * 1e6 for r, b in pairs)
        down = statistics.median(r["shutdown_s"] for r in rs)
        us = per[name]
        print(
            f"{name:<52} {statistics.median(us):7.2f}  ({min(us):.2f} - {max(us):.2f})  "
            f"{setup:8.3f}  {loop:12.2f}  {down:10.3f}  {lost[name]}"
        )
    sdk, ours = per["grpc: SDK (BatchSpanProcessor + OTLPSpanExporter)"], per["grpc: otel-tunix"]
    ratios = [o / s for o, s in zip(ours, sdk, strict=True)]
    print(
        f"whole process, grpc: otel-tunix / SDK OTLP path = {statistics.median(ratios):.3f}  "
        f"(target <= 0.2; rounds: {' / '.join(f'{r:.2f}' for r in ratios)}); spans lost at "
        f"the collector: {sum(lost.values())}  (target 0)"
    )


def _span_ratios(cpu_us: Any, bare: float, lost: dict[str, int]) -> None:
    for proto in ("grpc", "http"):
        sdk = cpu_us(f"{proto}: SDK (BatchSpanProcessor + OTLPSpanExporter)") - bare
        ours = cpu_us(f"{proto}: otel-tunix") - bare
        fallback = cpu_us(f"{proto}: otel-tunix, SDK exporter") - bare
        print(f"{proto}: otel-tunix / SDK OTLP path = {ours / sdk:.3f}  (target <= 0.2); "
              f"with the SDK exporter {fallback / sdk:.3f}")  # fmt: skip
    none = cpu_us("otel-tunix, no exporter") - bare
    for proto in ("grpc", "http"):
        alone = cpu_us(f"{proto}: otel-tunix") - bare - none
        print(f"  {proto}: the export alone = {alone:.2f} us/span")
    print(f"spans lost at the collector, all rows: {sum(lost.values())}  (target 0)")


def _gil(samples: dict[str, list[dict[str, Any]]]) -> None:
    gil_rows = {k.split("step, ")[-1]: samples[k] for k in ROWS if k.startswith("gil:")}
    step = {k: statistics.median(r["step_s"] for r in v) * 1e3 for k, v in gil_rows.items()}
    p99 = {k: statistics.median(r["step_p99_s"] for r in v) * 1e3 for k, v in gil_rows.items()}
    a = "otel-tunix, no exporter"
    for proto in ("gRPC", "HTTP"):
        b = f"otel-tunix + OTLP/{proto}"
        with_export = gil_rows[b]
        batch = max(r["batch_cpu_s"] for r in with_export) * 1e3
        during = [r["step_during_export_s"] for r in with_export if r["step_during_export_s"]]
        n_during = sum(r["steps_during_export"] for r in with_export)
        print(
            f"gil: CPU-bound step, median {step[a]:.3f} ms without export, {step[b]:.3f} ms "
            f"with OTLP/{proto}: ratio {step[b] / step[a]:.3f}  (target ~1); p99 "
            f"{p99[a]:.3f} / {p99[b]:.3f} ms; longest export batch {batch:.2f} ms of CPU"
        )
        if during:
            print(
                f"  the {n_during} steps that overlapped an export batch: median "
                f"{statistics.median(during) * 1e3:.3f} ms, against {step[b]:.3f} ms for all"
            )


if __name__ == "__main__":
    main()
