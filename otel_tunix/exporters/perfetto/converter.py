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

from otel_tunix.exporters.perfetto.model import ProcessInfo, TraceSpan, _as_int, _as_str
from otel_tunix.exporters.perfetto.writer import PerfettoTraceWriter
from otel_tunix.settings.attributes import (
    GOODPUT_CATEGORY,
    KIND_BLOCKED,
    KIND_BUSY,
    RANK,
    RUN_ID,
    SPAN_TYPE_COMPONENT,
    SPAN_TYPE_STEP,
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
                if obj.get("type") == "step":
                    writer.write_group(_records_from_step_line(obj, process))
                elif obj.get("type") == "span":  # background work that ended after its step
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
    kind = _as_str(obj.get("kind"))
    outside = obj.get("outside") is True
    return TraceSpan(
        name=str(obj.get("name") or "span"),
        start_ns=_as_int(obj.get("start_ns"), 0) or 0,
        end_ns=_as_int(obj.get("end_ns"), 0) or 0,
        trace_id=str(obj.get("trace_id") or ""),
        span_id=str(obj.get("span_id") or ""),
        parent_id=_as_str(obj.get("parent")),
        span_type=SPAN_TYPE_COMPONENT,
        scope=None if outside else str(obj.get("scope") or "default"),
        step=None if outside else _as_int(obj.get("step"), 0),
        time_kind=kind if kind in (KIND_BUSY, KIND_BLOCKED) else KIND_BUSY,
        thread_id=_as_int(obj.get("thread_id")) or None,
        thread_name=_as_str(obj.get("thread")) or None,
        attributes=_attributes(obj),
        process=process,
        error=_as_str(obj.get("error")),
    )


def _records_from_step_line(obj: Mapping[str, object], process: ProcessInfo) -> list[TraceSpan]:
    scope = str(obj.get("scope") or "default")
    step = _as_int(obj.get("step"), 0)
    trace_id = str(obj.get("trace_id") or "")
    step_id = str(obj.get("span_id") or "")
    attrs = obj.get("attributes")
    records = [
        TraceSpan(
            name=str(obj.get("name") or f"{scope}_step"),
            start_ns=_as_int(obj.get("start_ns"), 0) or 0,
            end_ns=_as_int(obj.get("end_ns"), 0) or 0,
            trace_id=trace_id,
            span_id=step_id,
            span_type=SPAN_TYPE_STEP,
            scope=scope,
            step=step,
            thread_id=_as_int(obj.get("thread_id")) or None,
            thread_name=_as_str(obj.get("thread")) or None,
            attributes=dict(attrs) if isinstance(attrs, dict) else {},
            process=process,
        )
    ]
    spans = obj.get("spans")
    for item in spans if isinstance(spans, list) else ():
        if not isinstance(item, dict):
            continue
        kind = _as_str(item.get("kind"))
        component = kind in (KIND_BUSY, KIND_BLOCKED)
        records.append(
            TraceSpan(
                name=str(item.get("name") or "span"),
                start_ns=_as_int(item.get("start_ns"), 0) or 0,
                end_ns=_as_int(item.get("end_ns"), 0) or 0,
                trace_id=trace_id,
                span_id=str(item.get("span_id") or ""),
                parent_id=_as_str(item.get("parent")) or step_id or None,
                span_type=SPAN_TYPE_COMPONENT if component else None,
                scope=scope,
                step=step,
                time_kind=kind if component else None,
                thread_id=_as_int(item.get("thread_id")) or None,
                thread_name=_as_str(item.get("thread")) or None,
                attributes=_attributes(item),
                process=process,
                error=_as_str(item.get("error")),
            )
        )
    return records


def _attributes(entry: Mapping[str, object]) -> dict[str, object]:
    """A span entry's attributes, with its declared goodput category among them (the key
    its span has)."""
    attrs = entry.get("attributes")
    out = dict(attrs) if isinstance(attrs, dict) else {}
    category = entry.get("category")
    if isinstance(category, str):
        out[GOODPUT_CATEGORY] = category
    return out


def _process_from_json(resource: Mapping[str, object], default_name: str) -> ProcessInfo:
    return ProcessInfo(
        service_name=str(resource.get("service.name") or default_name),
        host_name=str(resource.get("host.name") or ""),
        rank=_as_int(resource.get(RANK)),
        pid=_as_int(resource.get("process.pid")),
        run_id=str(resource.get(RUN_ID) or ""),
    )
