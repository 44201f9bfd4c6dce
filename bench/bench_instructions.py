"""Instructions per span, counted by valgrind: otel-tunix's stages against Tunix's tracer.

The timed benchmark (``bench_overhead.py``) is what the targets of issue #2 are stated in,
but on a shared 2-vCPU VM its rows move by 10-50 % from one hour to the next, which hides a
change of a few percent. Instruction counts do not move with the machine's load: this script
runs the loops under ``valgrind --tool=callgrind`` (which counts the instructions a process
executes, not seconds) and prints instructions per component, stage by stage, and per Tunix
``PerfTracer.span``, with their ratio. Use it to compare two versions of the code; the
targets themselves stay in seconds (an instruction of a dict lookup and one of a memory
allocation do not take the same time).

Each count is the difference of two runs that record ``--base`` and ``--base + --spans``
spans, so the interpreter's start-up and imports cancel out. Every stage runs on the calling
thread (otel-tunix's worker and export threads are kept out: their scheduling under valgrind
is not repeatable), with seeded span ids and, by default, Python's garbage collector off
(when it runs depends on every allocation of the process, so one collection more or less
moves a count by ~1 %); ``--gc`` counts it too. Stages:

* training thread: the ``step()`` / ``component()`` loop, finished steps set aside;
* + processing: the worker's work (``FinishedStep``, accounting, metrics, export queueing);
* + export: the export processor building the SDK spans for a null exporter that reads them.

Needs valgrind (``apt-get install valgrind``); google-tunix for the Tunix row.
Run: ``.venv/bin/python bench/bench_instructions.py``.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

STAGES = ("hot", "process", "export")
LABELS = {
    "hot": "otel-tunix, sampled: training thread",
    "process": "  + processing (worker)",
    "export": "  + export (null exporter)",
    "tunix": "Tunix PerfTracer.span",
}


def child(stage: str, n: int, per_step: int, distinct: bool = False) -> None:
    """Record ``n`` spans the way ``stage`` says (``distinct``: each component of a step
    its own name), then end the process at once (what shutdown would do is not part of the
    count)."""
    random.seed(0)
    if stage == "tunix":
        from tunix.perf.experimental.tracer import PerfTracer  # type: ignore[import-not-found]

        tracer = PerfTracer()
        for _ in range(2000):  # warm-up, as for otel-tunix
            with tracer.span("train_step_compute"):
                pass
        gc.collect()
        if not os.environ.get("BENCH_GC"):
            gc.disable()
        tracer = PerfTracer()
        for _ in range(n):
            with tracer.span("train_step_compute"):
                pass
        os._exit(0)

    import logging

    from opentelemetry.sdk.trace import TracerProvider

    import otel_tunix
    from otel_tunix.pipeline.export_processor import BatchExportProcessor
    from otel_tunix.support import ids as _ids
    from otel_tunix.testing import steps_set_aside

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_overhead import NullExporter, _loop

    _ids.seed(0)  # the same span ids on every run
    logging.getLogger("otel_tunix.metrics.alerts").setLevel(logging.ERROR)
    provider = TracerProvider()  # the export thread asleep: force_flush exports right here
    provider.add_span_processor(
        BatchExportProcessor(
            NullExporter(), max_queue_size=1 << 22, max_export_batch_size=1 << 22,
            schedule_delay_millis=3_600_000,
        )
    )  # fmt: skip
    otel_tunix.configure(
        service_name="bench",
        output_dir="none",
        tracer_provider=provider,
        perf=otel_tunix.PerformanceMetricsConfig(sampling_rate=2),
    )
    with steps_set_aside() as kept:  # warm-up
        _loop(2000, per_step, sampled=True, distinct=distinct)
        kept.process()
        provider.force_flush()
    gc.collect()
    if not os.environ.get("BENCH_GC"):
        gc.disable()
    with steps_set_aside() as kept:
        _loop(n, per_step, sampled=True, distinct=distinct)
        if stage != "hot":
            kept.process()
            if stage == "export":
                provider.force_flush()
    os._exit(0)


def count(stage: str, n: int, per_step: int, gc_on: bool, distinct: bool = False) -> int:
    """Instructions of one child run under callgrind."""
    env = {
        **os.environ,
        "PYTHONHASHSEED": "0",
        "OTEL_TUNIX_SYSTEM_METRICS_INTERVAL": "0",  # no sampler thread
        # numpy's OpenBLAS threads spin for a while after start-up, for as long as the
        # scheduler lets them: with them, two runs of the same code differed by up to 3 %
        "OPENBLAS_NUM_THREADS": "1",
        "BENCH_GC": "1" if gc_on else "",
    }
    cmd = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, __file__, "--child", stage, "--spans", str(n),
        "--per-step", str(per_step), *(["--distinct"] if distinct else []),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise RuntimeError(f"{stage}: valgrind run failed:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spans", type=int, default=40000, help="spans counted (the difference)")
    ap.add_argument("--base", type=int, default=5000, help="spans of the smaller run")
    ap.add_argument("--per-step", type=int, default=10, help="components per step")
    ap.add_argument("--gc", action="store_true", help="count the garbage collector too")
    ap.add_argument("--distinct", action="store_true", help="each component of a step its own name")
    ap.add_argument("--no-tunix", action="store_true", help="skip Tunix's row")
    ap.add_argument("--child", choices=(*STAGES, "tunix"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.spans, args.per_step, args.distinct)
        return
    if shutil.which("valgrind") is None:
        sys.exit("bench_instructions.py needs valgrind (apt-get install valgrind)")
    rows = list(STAGES)
    if not args.no_tunix:
        try:
            import tunix.perf.experimental.tracer  # type: ignore[import-not-found]  # noqa: F401

            rows.append("tunix")
        except Exception:
            print("Tunix PerfTracer.span: google-tunix not installed; row skipped")
    sizes = (args.base, args.base + args.spans)
    jobs = [(row, n) for row in rows for n in sizes]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        counts = dict(
            zip(
                jobs,
                pool.map(
                    lambda job: count(job[0], job[1], args.per_step, args.gc, args.distinct),
                    jobs,
                ),
                strict=True,
            )
        )
    per = {row: (counts[(row, sizes[1])] - counts[(row, sizes[0])]) / args.spans for row in rows}
    gc_note = "garbage collector counted" if args.gc else "garbage collector off"
    names = "each its own name" if args.distinct else "one name"
    print(
        f"instructions per span ({args.spans} spans, {args.per_step} to a step ({names}), "
        f"{gc_note})"
    )
    width = max(len(label) for label in LABELS.values())
    for row in rows:
        print(f"{LABELS[row]:<{width}}  {per[row]:9.0f}")
    if "tunix" in per:
        ratio = per["export"] / per["tunix"]
        print(f"\notel-tunix, every stage / Tunix PerfTracer.span = {ratio:.3f} (instructions)")


if __name__ == "__main__":
    main()
