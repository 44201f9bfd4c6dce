"""Offline conversion of a finished run's spans JSONL into a Perfetto trace."""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from otel_tunix.exporters.perfetto.model import ProcessInfo, TraceSpan, _as_int
from otel_tunix.exporters.perfetto.writer import PerfettoTraceWriter
from otel_tunix.model import record as rs
from otel_tunix.model.record import SpanInfo
from otel_tunix.settings.attributes import (
    GOODPUT_CATEGORY,
    RANK,
    RUN_ID,
    SPAN_TYPE_COMPONENT,
    SPAN_TYPE_STEP,
    STEP_BLOCKED_TIME,
    STEP_BUSY_TIME,
    STEP_DURATION,
    STEP_IDLE_TIME,
)
from otel_tunix.support.linefile import MAX_LINE_BYTES, capped_lines

__all__ = ["ConversionTimeout", "convert_jsonl_to_perfetto"]

logger = logging.getLogger(__name__)


# --- offline conversion ------------------------------------------------------------------


class ConversionTimeout(TimeoutError):
    """The conversion passed its ``deadline`` (the trace written so far is incomplete)."""


def convert_jsonl_to_perfetto(
    jsonl_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    deadline: float | None = None,
) -> int:
    """Convert a spans JSONL file (plain or ``.gz``) of a finished run to a Perfetto trace.

    Every ``{"type": "step", ...}`` line becomes one step slice, its component slices on
    their threads, and its busy / blocked / idle counters, through the same translation the
    exporter uses; a ``{"type": "span", ...}`` line (background work that ended after its
    step, or, with ``outside: true``, a component recorded outside any step, no scope or
    step) one slice on its thread, under its parent once that is written. Other lines are
    skipped, as is a last line cut short by a crash. A line with a ``resource`` object
    (``service.name``, ``host.name``, ``tunix.rank``, ``process.pid``) names the process
    track of the steps after it.

    Args:
        jsonl_path: The spans JSONL file.
        out_path: The ``.pftrace`` file to write (overwritten).
        deadline: A ``time.monotonic()`` value to stop at (a run's shutdown budget).

    Returns:
        The number of slices written.

    Raises:
        ConversionTimeout: ``deadline`` passed before the end of the file.
    """
    src_path = Path(jsonl_path)
    stem = src_path.name.removesuffix(".gz").removesuffix(".jsonl")
    process = ProcessInfo(service_name=stem)
    bad, first_bad = 0, 0
    with _open_source(src_path) as src, open(out_path, "wb") as dst:
        writer = PerfettoTraceWriter(dst)
        for line_no, line in enumerate(capped_lines(src), 1):
            if deadline is not None and not line_no & 15 and time.monotonic() > deadline:
                raise ConversionTimeout(f"{src_path}: stopped at line {line_no}")
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    continue
                resource = obj.get("resource")
                if isinstance(resource, dict):
                    process = _process_from_json(resource, stem)
                if obj.get(rs.TYPE) == rs.TYPE_STEP:
                    writer.write_group(_records_from_step_line(obj, process))
                elif obj.get(rs.TYPE) == rs.TYPE_SPAN:  # background work that ended after its step
                    writer.add(_record_from_span_line(obj, process))
            except (ValueError, TypeError, OverflowError, RecursionError):
                # not JSON (cut short, not UTF-8, binary), nested too deep, a value no
                # slice can hold: the line is skipped and counted, said once at the end
                bad += 1
                first_bad = first_bad or line_no
        writer.flush_pending()
    if bad:
        logger.warning(
            "%s: %d line(s) skipped (not JSON, not UTF-8, nested too deep, longer than "
            "%d MB, or values no slice can hold); the first at line %d",
            src_path,
            bad,
            MAX_LINE_BYTES >> 20,
            first_bad,
        )
    return writer.slice_count


def _open_source(path: Path) -> IO[bytes]:
    """``path`` for reading bytes; gzip when its first bytes say so (whatever its name)."""
    f = open(path, "rb")
    if f.read(2) == b"\x1f\x8b":
        f.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    f.seek(0)
    return f


def _record_from_span_line(obj: Mapping[str, object], process: ProcessInfo) -> TraceSpan:
    """A ``type: "span"`` line: one component span handed on apart from its step's line (or
    recorded outside any step: ``outside: true``)."""
    outside = obj.get(rs.OUTSIDE) is True
    return _component_record(
        SpanInfo.from_json(obj),
        str(obj.get(rs.TRACE_ID) or ""),
        None if outside else str(obj.get(rs.SCOPE) or "default"),
        None if outside else rs.as_int64(obj.get(rs.STEP)),
        process,
    )


def _records_from_step_line(obj: Mapping[str, object], process: ProcessInfo) -> list[TraceSpan]:
    """A step line: its step span, with the accounting the line stores (what the step
    span's attributes carry: the writer's counters read it, never recompute it), then its
    components."""
    line = rs.read_step_line(obj)
    accounting = {
        STEP_DURATION: line.step_time_sec,
        STEP_BUSY_TIME: line.busy_time_sec,
        STEP_BLOCKED_TIME: line.blocked_time_sec,
        STEP_IDLE_TIME: line.idle_time_sec,
    }
    records = [
        TraceSpan(
            name=f"{line.scope}_step",
            start_ns=line.start_ns,
            end_ns=line.end_ns,
            trace_id=line.trace_id,
            span_id=line.span_id,
            span_type=SPAN_TYPE_STEP,
            scope=line.scope,
            step=line.step,
            attributes={**line.attributes, **accounting},
            process=process,
            error=line.error,
        )
    ]
    for info in line.spans:
        if not info.parent:
            info.parent = line.span_id or None
        records.append(_component_record(info, line.trace_id, line.scope, line.step, process))
    return records


def _component_record(
    info: SpanInfo, trace_id: str, scope: str | None, step: int | None, process: ProcessInfo
) -> TraceSpan:
    """A component read back (:meth:`SpanInfo.from_json`) as a trace record: its attributes
    with the goodput category it was recorded with among them (the key its span has)."""
    attrs = dict(info.attributes)
    if info.category is not None:
        attrs[GOODPUT_CATEGORY] = info.category
    return TraceSpan(
        name=info.name or "span",
        start_ns=info.start_ns,
        end_ns=info.end_ns,
        trace_id=trace_id,
        span_id=info.span_id,
        parent_id=info.parent,
        span_type=SPAN_TYPE_COMPONENT,
        scope=scope,
        step=step,
        time_kind=info.kind,
        thread_id=info.thread_id or None,
        thread_name=info.thread or None,
        attributes=attrs,
        process=process,
        error=info.error,
    )


def _process_from_json(resource: Mapping[str, object], default_name: str) -> ProcessInfo:
    return ProcessInfo(
        service_name=str(resource.get("service.name") or default_name),
        host_name=str(resource.get("host.name") or ""),
        rank=_as_int(resource.get(RANK)),
        pid=_as_int(resource.get("process.pid")),
        run_id=str(resource.get(RUN_ID) or ""),
    )
