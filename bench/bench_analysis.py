"""Throughput and peak memory of the local analysis tools on large generated run files.

Generates a ``metrics.jsonl`` (the MetricsLogger's layout: a loss record and a perf record
per step) and a ``spans.jsonl`` (the SDK's layout: one line per step with five component
spans, then a session line) of ``--size-mb`` each, then measures, each in a fresh Python
process so that the peak resident memory is that of the one task:

* ``plot``: ``otel-tunix plot``'s path (read two metrics, moving average over 20, draw,
  write a PNG);
* ``summary``: ``otel-tunix summary``'s path (breakdown, goodput, anomalies);
* ``goodput``: ``otel-tunix goodput``'s path (the job ledger of the run);
* ``baseline``: the same imports and nothing read, to show what the reading itself adds.

Prints rows per second, MB per second and peak RSS, measured in this one run::

    python bench/bench_analysis.py                 # 100 MB files (well under a minute)
    python bench/bench_analysis.py --size-mb 1000  # 1 GB files
    python bench/bench_analysis.py --gzip          # the same, gzip-compressed
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

_STEP_NS = 50_000_000
_T0 = 1_800_000_000_000_000_000


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "wt", encoding="utf-8", compresslevel=1)  # type: ignore[return-value]
    return open(path, "w", encoding="utf-8")


def write_metrics(path: Path, size_mb: float) -> int:
    """A metrics JSONL of about ``size_mb`` MB (uncompressed); returns the record count."""
    target = int(size_mb * 1e6)
    rng = random.Random(0)
    written = rows = 0
    with _open(path) as f:
        head = json.dumps({"type": "meta", "time": 1.8e9, "run": "bench", "rank": 0}) + "\n"
        f.write(head)
        written += len(head)
        n = 0
        while written < target:
            loss = 10.0 / (1 + n / 1000) + rng.random()
            t = 1.8e9 + n * 0.05
            a = (
                f'{{"step": {n}, "time": {t:.4f}, "metrics": {{"loss": {loss:.6f}, '
                f'"perplexity": {loss * 3:.6f}, "learning_rate": {1e-3 / (1 + n / 1e5):.8g}, '
                f'"grad_norm": {rng.random() * 5:.6f}}}}}\n'
            )
            st = 0.05 + rng.random() * 0.01
            b = (
                f'{{"step": {n}, "time": {t + 0.001:.4f}, "metrics": {{'
                f'"perf/train/step_time_sec": {st:.9f}, "perf/train/busy_time_sec": '
                f'{st * 0.9:.9f}, "perf/train/blocked_time_sec": {st * 0.09:.9f}, '
                f'"perf/train/idle_time_sec": {st * 0.01:.9f}, '
                f'"perf/train/train_data_load/blocked_time_sec": {st * 0.09:.9f}, '
                f'"perf/train/train_step_compute/busy_time_sec": {st * 0.9:.9f}, '
                f'"perf/train/forward/busy_time_sec": {st * 0.3:.9f}, '
                f'"perf/train/backward/busy_time_sec": {st * 0.4:.9f}, '
                f'"perf/train/optimizer_step/busy_time_sec": {st * 0.2:.9f}}}}}\n'
            )
            f.write(a)
            f.write(b)
            written += len(a) + len(b)
            rows += 2
            n += 1
    return rows


def _span(name: str, kind: str, s: int, e: int, sid: int, parent: int) -> str:
    return (
        f'{{"name": "{name}", "kind": "{kind}", "start_ns": {s}, "end_ns": {e}, '
        f'"thread": "MainThread", "thread_id": 140000000000001, "span_id": "{sid:016x}", '
        f'"parent": "{parent:016x}"}}'
    )


def write_spans(path: Path, size_mb: float) -> int:
    """A spans JSONL of about ``size_mb`` MB (uncompressed); returns the step count."""
    target = int(size_mb * 1e6)
    rng = random.Random(1)
    written = n = 0
    busy_total = blocked_total = 0.0
    with _open(path) as f:
        while written < target:
            start = _T0 + n * _STEP_NS
            data = int(2e6 + rng.random() * 1e6)
            fwd, bwd, opt = (int(x * (1 + rng.random() * 0.1)) for x in (10e6, 15e6, 8e6))
            if n % 997 == 13:  # a slow step now and then
                bwd *= 5
            c0 = start + data
            end = c0 + fwd + bwd + opt + 50_000
            root = 2 * n + 1
            spans = [
                _span("train_data_load", "blocked", start, c0, 10 * n + 2, root),
                _span("train_step_compute", "busy", c0, end - 50_000, 10 * n + 3, root),
                _span("forward", "busy", c0, c0 + fwd, 10 * n + 4, 10 * n + 3),
                _span("backward", "busy", c0 + fwd, c0 + fwd + bwd, 10 * n + 5, 10 * n + 3),
                _span("optimizer_step", "busy", c0 + fwd + bwd, end - 50_000, 10 * n + 6,
                      10 * n + 3),
            ]  # fmt: skip
            busy = (end - 50_000 - c0) * 1e-9
            st = (end - start) * 1e-9
            busy_total += busy
            blocked_total += data * 1e-9
            line = (
                f'{{"type": "step", "scope": "train", "step": {n}, "start_ns": {start}, '
                f'"end_ns": {end}, "trace_id": "{n:032x}", "step_time_sec": {st}, '
                f'"busy_time_sec": {busy}, "blocked_time_sec": {data * 1e-9}, '
                f'"idle_time_sec": {st - busy - data * 1e-9}, "components": {{'
                f'"train_data_load": {{"busy_time_sec": 0.0, "blocked_time_sec": {data * 1e-9},'
                f' "count": 1}}, "train_step_compute": {{"busy_time_sec": {busy}, '
                f'"blocked_time_sec": 0.0, "count": 1}}, "forward": {{"busy_time_sec": '
                f'{fwd * 1e-9}, "blocked_time_sec": 0.0, "count": 1}}, "backward": '
                f'{{"busy_time_sec": {bwd * 1e-9}, "blocked_time_sec": 0.0, "count": 1}}, '
                f'"optimizer_step": {{"busy_time_sec": {opt * 1e-9}, "blocked_time_sec": 0.0, '
                f'"count": 1}}}}, "spans": [{", ".join(spans)}]}}\n'
            )
            f.write(line)
            written += len(line)
            n += 1
        last_end = _T0 + n * _STEP_NS
        session = {
            "type": "session", "scope": "train", "steps": n, "sampled_steps": n,
            "first_start_ns": _T0, "last_end_ns": last_end,
            "wall_time_sec": (last_end - _T0) * 1e-9,
            "steps_per_sec": n / ((last_end - _T0) * 1e-9),
            "busy_time_sec": busy_total, "blocked_time_sec": blocked_total,
        }  # fmt: skip
        f.write(json.dumps(session) + "\n")
    return n


# --- the measured tasks (run in a child process) ---------------------------------------------


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def task(name: str, path: Path, out_dir: Path) -> dict[str, Any]:
    """Run one task in this process and return its measurements."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas  # noqa: F401

    from otel_tunix.analysis.breakdown import summarize
    from otel_tunix.analysis.ledger import job_ledger
    from otel_tunix.analysis.plotting import PlotSpec, load_runs, render, save_plot

    rss0 = _peak_rss_mb()
    t = time.perf_counter()
    rows = 0
    if name == "plot":
        spec = PlotSpec(metrics=["loss", "perf/train/step_time_sec"], smooth=20)
        tables = load_runs([path], spec)
        for table in tables:
            table.poll()
        rows = tables[0].stats.lines  # records read (the CLI's one-shot path follows)
        rendered = render(tables, spec, release=True)
        save_plot(rendered.figure, out_dir / "bench.png")
    elif name == "summary":
        summary = summarize(path)
        rows = sum(s.sampled_steps for s in summary.scopes)
    elif name == "goodput":
        ledger = job_ledger(path)
        rows = sum(r.steps for j in ledger.jobs for r in j.runs)
    elapsed = time.perf_counter() - t
    return {
        "task": name,
        "rows": rows,
        "seconds": elapsed,
        "peak_rss_mb": _peak_rss_mb(),
        "rss_before_mb": rss0,
    }


def _child(name: str, path: Path, out_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--task", name, "--file", str(path), "--dir", str(out_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"{name} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=100.0, help="size of each file (100)")
    ap.add_argument("--gzip", action="store_true", help="write the files gzip-compressed")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    ap.add_argument(
        "--task", choices=["plot", "summary", "goodput", "baseline"], help=argparse.SUPPRESS
    )
    ap.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.task:  # the child process
        print(json.dumps(task(args.task, args.file, args.dir)))
        return

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        ext = ".jsonl.gz" if args.gzip else ".jsonl"
        metrics, spans = d / f"metrics{ext}", d / f"spans{ext}"
        t = time.perf_counter()
        n_rows = write_metrics(metrics, args.size_mb)
        n_steps = write_spans(spans, args.size_mb)
        gen = time.perf_counter() - t
        sizes = {p: p.stat().st_size / 1e6 for p in (metrics, spans)}
        print(
            f"generated in {gen:.1f} s: {metrics.name} {sizes[metrics]:.1f} MB ({n_rows} records), "
            f"{spans.name} {sizes[spans]:.1f} MB ({n_steps} steps)"
        )
        base = _child("baseline", metrics, d)
        print(f"baseline (imports only): peak RSS {base['peak_rss_mb']:.0f} MB")
        print(f"{'task':<8} {'file MB':>8} {'rows':>10} {'s':>7} {'rows/s':>10} {'MB/s':>7} "
              f"{'peak RSS MB':>12} {'over baseline':>14}")  # fmt: skip
        for name, path in (("plot", metrics), ("summary", spans), ("goodput", spans)):
            r = _child(name, path, d)
            mb = sizes[path]
            print(
                f"{name:<8} {mb:>8.1f} {r['rows']:>10} {r['seconds']:>7.2f} "
                f"{r['rows'] / r['seconds']:>10.0f} {mb / r['seconds']:>7.1f} "
                f"{r['peak_rss_mb']:>12.0f} {r['peak_rss_mb'] - base['peak_rss_mb']:>14.0f}"
            )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; one run, not averaged")


if __name__ == "__main__":
    main()
