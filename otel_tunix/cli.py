"""The ``otel-tunix`` command: ``demo``, ``plot``, ``summary``, ``goodput``, ``convert``.

Each subcommand imports what it needs only when it runs, so ``otel-tunix --help`` is instant
and ``summary`` / ``convert`` work without pandas or matplotlib. Every error that the user
can fix (a missing file, an unknown metric, a missing extra) is one line on stderr and exit
status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from otel_tunix.analysis.breakdown import summarize
from otel_tunix.analysis.ledger import job_ledger
from otel_tunix.analysis.ledger_tables import render_ledger
from otel_tunix.analysis.plotting import (
    DEFAULT_MAX_POINTS,
    PlotSpec,
    Rendered,
    load_runs,
    render,
    save_plot,
    watch,
)
from otel_tunix.analysis.readers import AnalysisError, resolve_spans_files, runs_note
from otel_tunix.analysis.summary_tables import render_summary
from otel_tunix.demos.rl import main as rl_main
from otel_tunix.demos.sft import main as demo_main
from otel_tunix.settings.parsing import ConfigurationError

_USAGE = """usage: otel-tunix COMMAND [options]

commands:
  demo      train a tiny transformer language model on the CPU and show the breakdown
            (--rl: an asynchronous GRPO-style loop with rollout workers and a learner)
  plot      plot metrics of one or more runs (metrics.jsonl, plain or .gz) to a PNG
  summary   step-time breakdown, goodput, anomalous steps and ranks of a finished run
  goodput   the job's goodput ledger over its runs (restarts, redone steps, badput)
  convert   convert a run's spans JSONL to a Perfetto trace

Run 'otel-tunix COMMAND --help' for a command's options.
"""

_ANALYSIS = "pip install 'otel-tunix[analysis]'"

_NON_INTERACTIVE = frozenset({"agg", "cairo", "pdf", "pgf", "ps", "svg", "template"})


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def _run(prog: str, fn: Callable[[], int]) -> int:
    """Run a subcommand, turning the errors a user can fix into one line and status 2."""
    try:
        return fn()
    except BrokenPipeError:  # `otel-tunix summary --json | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except AnalysisError as exc:
        return _fail(prog, str(exc))
    except ImportError as exc:  # a missing extra: one line that names it
        said = str(exc)
        return _fail(prog, said if "pip install" in said else f"{said}: {_ANALYSIS}")
    except ConfigurationError as exc:  # a setting (OTEL_*) the installed extras cannot serve
        return _fail(prog, str(exc))
    except OSError as exc:
        return _fail(prog, f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))


def _parse(ap: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace | int:
    try:
        return ap.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2


# --- plot ------------------------------------------------------------------------------------


def _plot_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="otel-tunix plot",
        description="Plot metrics of one or more runs on one chart (one panel per metric, one "
        "line per run, legends from the run names).",
        epilog="Inputs: a metrics JSONL file (plain or .gz), a run folder, or a folder of runs "
        "(the newest metrics file is used). Without --metrics the common ones that exist are "
        "drawn (loss, learning rate, step time, reward). Alerts that fired (alerts.jsonl beside "
        "the metrics file) are marked on the panel of their metric. Without --out and --show "
        "the plot goes to metrics.png next to the first input's metrics file.",
    )
    ap.add_argument("paths", nargs="*", metavar="PATH", help="metrics files or run folders")
    ap.add_argument("--input", "-i", nargs="+", default=[], metavar="PATH", help="more inputs")
    ap.add_argument(
        "--metrics",
        "-m",
        nargs="+",
        metavar="NAME",
        help="metric names as written (loss, train.loss, rewards/mean) or prefixes (perf/train)",
    )
    ap.add_argument("--x-key", default="step", help="x axis: step (default), time, epoch, ...")
    ap.add_argument("--smooth", type=int, default=0, metavar="N", help="moving average window")
    ap.add_argument("--out", "-o", type=Path, help="image file to write (.png, .svg, .pdf)")
    ap.add_argument("--show", action="store_true", help="open an interactive window")
    ap.add_argument("--live", action="store_true", help="re-render as the files grow (Ctrl-C)")
    ap.add_argument("--interval", type=float, default=2.0, help="--live poll interval, seconds")
    ap.add_argument(
        "--max-points",
        type=int,
        default=None,
        help="thin each line to about this many points (default 5000; 0: draw all)",
    )
    ap.add_argument("--title", help="figure title")
    return ap


def _plot(argv: Sequence[str]) -> int:
    prog = "otel-tunix plot"
    ap = _plot_parser()
    args = _parse(ap, argv)
    if isinstance(args, int):
        return args
    inputs = [*args.paths, *args.input]
    if not inputs:
        return _fail(prog, "give one or more metrics files or run folders (PATH or --input)")
    if args.smooth < 0:
        return _fail(prog, f"--smooth must be 0 or more, got {args.smooth}")
    if args.interval <= 0:
        return _fail(prog, f"--interval must be positive, got {args.interval}")
    if args.max_points is not None and args.max_points < 0:
        return _fail(prog, f"--max-points must be 0 or more, got {args.max_points}")
    return _run(prog, lambda: _plot_run(prog, args, inputs))


def _plot_run(prog: str, args: argparse.Namespace, inputs: list[str]) -> int:
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
    except ImportError as exc:
        hint = "pip install 'otel-tunix[analysis]'"
        return _fail(prog, f"plots need pandas and matplotlib: {hint} ({exc})")
    max_points = DEFAULT_MAX_POINTS if args.max_points is None else (args.max_points or None)
    spec = PlotSpec(
        metrics=args.metrics,
        x_key=args.x_key,
        smooth=args.smooth,
        max_points=max_points,
        title=args.title,
    )
    out: Path | None = args.out
    if out is not None and out.suffix:
        from matplotlib.figure import Figure

        kinds = Figure().canvas.get_supported_filetypes()
        if out.suffix.lstrip(".").lower() not in kinds:
            return _fail(
                prog, f"--out {out}: unknown image type; use one of: {', '.join(sorted(kinds))}"
            )
    tables = load_runs(inputs, spec)
    for given, table in zip(inputs, tables, strict=True):
        _say_which_run(prog, given, table.path)
    if out is None and not args.show:
        out = tables[0].path.parent / "metrics.png"
    fig: Any = None
    plt: Any = None
    if args.show:
        import matplotlib.pyplot as plt

        if plt.get_backend().lower() in _NON_INTERACTIVE:
            if out is None:
                return _fail(
                    prog,
                    f"--show needs a display, and matplotlib has only the non-interactive "
                    f"backend {plt.get_backend()!r} here; write a file with --out FILE",
                )
            print(f"{prog}: no display here; writing {out} only", file=sys.stderr)
            plt = None
        else:
            fig = plt.figure(figsize=(9.0, 7.0), layout="constrained")

    def described(r: Rendered) -> str:
        rows = ", ".join(f"{df.attrs.get('run')} ({len(df)} rows)" for df in r.frames)
        return f"metrics {', '.join(r.metrics)}; runs {rows}"

    if args.live:
        print(f"watching {', '.join(str(t.path) for t in tables)} (Ctrl-C to stop)", flush=True)
        errors: set[str] = set()

        def on_update(r: Rendered) -> None:
            print(f"updated {out if out else 'window'}: {described(r)}", flush=True)

        def on_error(exc: Exception) -> None:
            if str(exc) not in errors:
                errors.add(str(exc))
                print(f"{prog}: waiting: {exc}", file=sys.stderr, flush=True)

        watch(
            tables,
            spec,
            out=out,
            interval=args.interval,
            fig=fig,
            on_update=on_update,
            on_error=on_error,
            stop=(lambda: not plt.fignum_exists(fig.number)) if plt is not None else None,
            pause=plt.pause if plt is not None else time.sleep,
        )
        return 0

    for t in tables:
        t.poll(final=True)
    rendered = render(tables, spec, fig=fig, release=True)
    if out is not None:
        save_plot(rendered.figure, out)
        print(f"wrote {out}: {described(rendered)}")
    if plt is not None:
        plt.show()
    return 0


def _say_which_run(prog: str, given: str, chosen: Path) -> None:
    """A folder that holds several runs (``output_dir=`` given to each): say which is read."""
    note = runs_note(given, chosen)
    if note is not None:
        print(f"{prog}: {note}", file=sys.stderr)


# --- summary -----------------------------------------------------------------------------------


def _summary(argv: Sequence[str]) -> int:
    prog = "otel-tunix summary"
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Step-time breakdown per scope and component (mean, p50, p95, share), "
        "busy / blocked / idle, steps/s, goodput with its badput, anomalous steps (slower than "
        "median + 3·MAD) and, for several ranks, a per-rank table.",
        epilog="RUN is a run folder (spans.jsonl, or spans-rank<N>.jsonl for every rank), a "
        "folder of runs (the newest is used, and the others named) or a spans JSONL file "
        "(plain or .gz).",
    )
    ap.add_argument("run", metavar="RUN", help="run folder or spans JSONL file")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument(
        "--anomalies", type=int, default=10, metavar="N", help="anomalous steps listed (10)"
    )
    args = _parse(ap, argv)
    if isinstance(args, int):
        return args

    def run() -> int:
        summary = summarize(args.run)
        if args.json:
            print(json.dumps(summary.to_json(), indent=2))
        else:
            render_summary(summary, max_anomalies=max(0, args.anomalies))
        return 0

    return _run(prog, run)


# --- goodput -----------------------------------------------------------------------------------


def _goodput(argv: Sequence[str]) -> int:
    prog = "otel-tunix goodput"
    ap = argparse.ArgumentParser(
        prog=prog,
        description="The goodput ledger of a job across its runs (restarts): productive time "
        "over wall time, and the badput by category (initialization, compilation, data "
        "stall, checkpoint save / restore, evaluation, wasted progress, restart gap, ...).",
        epilog="PATH is a run folder, a folder of runs (a folder given to a resumed job, or "
        "otel-tunix-runs) or a spans JSONL file. Runs with the same tunix.job.id are one job. "
        "Rules: docs/goodput.md.",
    )
    ap.add_argument("path", metavar="PATH", help="run folder, folder of runs, or spans file")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = _parse(ap, argv)
    if isinstance(args, int):
        return args

    def run() -> int:
        ledger = job_ledger(args.path)
        if args.json:
            print(json.dumps(ledger.to_json(), indent=2))
        else:
            render_ledger(ledger)
        return 0

    return _run(prog, run)


# --- convert -----------------------------------------------------------------------------------


def _convert(argv: Sequence[str]) -> int:
    prog = "otel-tunix convert"
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Convert a finished run's spans JSONL (plain or .gz) to another format, "
        "with the same translation as the live exporter.",
    )
    ap.add_argument("input", metavar="SPANS", help="spans JSONL file or run folder")
    ap.add_argument("--to", required=True, choices=["perfetto"], help="output format")
    ap.add_argument("output", metavar="OUT", type=Path, help="file to write (.pftrace)")
    args = _parse(ap, argv)
    if isinstance(args, int):
        return args

    def run() -> int:
        files = resolve_spans_files(args.input)
        _say_which_run(prog, args.input, files[0])
        if len(files) > 1:
            return _fail(
                prog,
                f"{args.input} holds one spans file per rank; convert one at a time: "
                + ", ".join(str(f) for f in files),
            )
        try:
            from otel_tunix.exporters.perfetto import convert_jsonl_to_perfetto
        except ImportError as exc:
            return _fail(prog, str(exc))
        out: Path = args.output
        out.parent.mkdir(parents=True, exist_ok=True)
        n = convert_jsonl_to_perfetto(files[0], out)
        if n == 0:
            out.unlink(missing_ok=True)
            return _fail(prog, f"{files[0]}: no step records to convert")
        print(f"wrote {out}: {n} slices from {files[0]} (open it in https://ui.perfetto.dev)")
        return 0

    return _run(prog, run)


_COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "plot": _plot,
    "summary": _summary,
    "goodput": _goodput,
    "convert": _convert,
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand; imports stay lazy so ``--help`` is instant."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "demo":
        if "--rl" in rest:
            rl_args = [a for a in rest if a != "--rl"]
            return _run("otel-tunix demo --rl", lambda: rl_main(rl_args))
        return _run("otel-tunix demo", lambda: demo_main(rest))
    handler = _COMMANDS.get(command)
    if handler is not None:
        return handler(rest)
    print(f"otel-tunix: unknown command {command!r}\n\n{_USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
