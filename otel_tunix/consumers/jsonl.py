"""The spans JSONL file: one line per sampled step, flushed as the step ends.

The first line, ``type: "run"``, names the run: ``run_id``, ``start_ns`` (when
``configure()`` ran, Unix ns), ``sampling_rate``, the ``resource`` attributes (rank
included), the job: ``job_id``, ``attempt`` (from 1), ``process_start_ns`` (when the process
started, Unix ns) and, in a later attempt, ``link`` (``trace_id``, ``span_id``,
``attributes``: the first step span's link to the previous attempt, see
:mod:`otel_tunix.run.job`); it is flushed at once. Each ``type: "step"`` line is
:meth:`otel_tunix.model.steps.StepSummary.to_json`: scope, step, start/end (Unix ns), trace id and
step span id, the busy / blocked / idle counters, per-component times and every component
span (name, kind, start/end, thread, span id, parent; ``category`` when it was recorded with
a goodput category; the fields: :mod:`otel_tunix.model.record`); ``links`` when the step's
code linked spans (a learner step's rollouts, :func:`otel_tunix.rl.consume`: ``trace_id``,
``span_id``, ``attributes`` each). A ``type: "span"`` line is a component handed on apart
from its step's line (background work that ended after it), or, with ``outside: true`` and
no ``scope`` or ``step``, one recorded outside any step. At shutdown one ``type: "session"``
line per scope carries the totals. A ``.gz`` path writes gzip. The file
is flushed after every batch of steps the worker processes (at most
``OTEL_TUNIX_PROCESS_INTERVAL_MS``, 250 ms, apart; each step on its own when steps take
longer), so a hard kill loses only the most recent steps; an exception or a normal exit
loses none (shutdown processes everything queued). Lines are whole, a full disk included:
a batch that cannot be written is cut back to the last whole line, counted as lost in
``summary.json`` (``write_errors``) and reported once
(:class:`otel_tunix.support.linefile.LineFile`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.model.steps import ScopeSession, StepSummary
from otel_tunix.pipeline.background import BackgroundSpan
from otel_tunix.pipeline.outside import OutsideSpan
from otel_tunix.support.errors import ReportOnce
from otel_tunix.support.fork import at_fork_in_child, silence_file
from otel_tunix.support.json_lines import all_finite, dumps_line
from otel_tunix.support.linefile import LineFile

_logger = logging.getLogger(__name__)


class StepJsonlWriter(StepSink):
    """A step sink (see :class:`otel_tunix.consumers.step_accounting.StepSink`) that writes the
    spans JSONL."""

    def __init__(
        self, path: str | os.PathLike[str], header: Mapping[str, object] | None = None
    ) -> None:
        self.path = Path(path)
        self._file = LineFile(self.path)
        self._lock = threading.Lock()
        self._report = ReportOnce(_logger)
        at_fork_in_child(self._after_fork_in_child)
        if header is not None:  # on disk at once: a later attempt of the job reads it, even
            # from a run killed before its first step (run/job.py)
            self._write({"type": "run", **header})
            self._file.flush()

    def on_step(self, summary: StepSummary) -> None:
        self.on_steps((summary,))

    def on_steps(self, summaries: Sequence[StepSummary]) -> None:
        """A batch of steps: their lines written with one call (a step that cannot be
        encoded is reported once and skipped; the others are written)."""
        lines = []
        for s in summaries:
            try:
                # Our numbers are finite; an attribute a user set on the step might not be.
                lines.append(dumps_line(s.to_json(), finite=all_finite(s.attributes.values())))
            except Exception:
                self._report("encode", "otel-tunix: a step could not be written to %s", self.path)
        self._write_lines(lines)

    def on_background_spans(self, spans: Sequence[BackgroundSpan]) -> None:
        """A ``type: "span"`` line each: a background span that ended after its step's
        line was written."""
        self._write_lines([dumps_line(s.to_json(), finite=True) for s in spans])

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        """A ``type: "span"``, ``outside: true`` line each: a component recorded outside
        any step (its own attributes may be any number: checked)."""
        lines = []
        for s in spans:
            obj = s.to_json()
            try:
                lines.append(dumps_line(obj, finite=all_finite(s.attributes.values())))
            except Exception:
                self._report("encode", "otel-tunix: a span could not be written to %s", self.path)
        self._write_lines(lines)

    def on_session(self, sessions: list[ScopeSession]) -> None:
        for s in sessions:
            self._write(s.to_json())

    def _write(self, obj: dict[str, object]) -> None:
        """The run and session lines: sums and attributes, checked for finiteness here."""
        self._write_lines((dumps_line(obj, finite=all_finite(obj.values())),))

    def _write_lines(self, lines: Sequence[str]) -> None:
        text = "".join(line + "\n" for line in lines)
        with self._lock:
            self._file.write(text, len(lines))

    def flush(self) -> None:
        """Flush written lines to the OS (called after each batch of steps)."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def _after_fork_in_child(self) -> None:
        """A forked child's copy: a new lock, and the parent's file silenced (the child's copy
        of its buffer is never written to it)."""
        self._lock = threading.Lock()
        silence_file(self._file)
