"""Local-first analysis of a run folder: metric plots, the run summary, the goodput ledger.

The same functions back ``otel-tunix plot`` / ``otel-tunix summary`` and
``notebooks/metrics_viewer.ipynb``::

    from otel_tunix.analysis import read_jsonl, filter_metrics, moving_average
    from otel_tunix.analysis import plot_metrics, save_plot, summarize

    df = read_jsonl("otel-tunix-runs/<run id>")            # a run folder, a file, or .gz
    df = moving_average(filter_metrics(df, ["loss"]), window=20)
    save_plot(plot_metrics([df], ["loss"]), "loss.png")
    print(summarize("otel-tunix-runs/<run id>").goodput.goodput)
    print(job_ledger("otel-tunix-runs").to_json())              # every job, across restarts

Plots need pandas and matplotlib (``pip install 'otel-tunix[analysis]'``); importing this
package does not import them.
"""

from __future__ import annotations

from otel_tunix.analysis.breakdown import RunSummary, summarize
from otel_tunix.analysis.ledger import Ledger, job_ledger
from otel_tunix.analysis.metrics import (
    default_metrics,
    filter_metrics,
    metric_names,
    moving_average,
)
from otel_tunix.analysis.plotting import PlotSpec, load_runs, plot_metrics, render, save_plot, watch
from otel_tunix.analysis.readers import (
    AnalysisError,
    MetricsTable,
    flatten_record,
    iter_records,
    read_jsonl,
    resolve_metrics_file,
    resolve_spans_files,
)
from otel_tunix.analysis.summary_tables import render_summary

__all__ = [
    "AnalysisError",
    "Ledger",
    "MetricsTable",
    "PlotSpec",
    "RunSummary",
    "default_metrics",
    "filter_metrics",
    "flatten_record",
    "iter_records",
    "job_ledger",
    "load_runs",
    "metric_names",
    "moving_average",
    "plot_metrics",
    "read_jsonl",
    "render",
    "render_summary",
    "resolve_metrics_file",
    "resolve_spans_files",
    "save_plot",
    "summarize",
    "watch",
]
