"""The OpenTelemetry span exporter that streams spans into a Perfetto trace file."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_tunix.exporters.perfetto.model import ProcessInfo, TraceSpan, _as_int
from otel_tunix.exporters.perfetto.writer import DEFAULT_MAX_PENDING_SPANS, PerfettoTraceWriter
from otel_tunix.settings.attributes import RANK
from otel_tunix.settings.values import load_settings
from otel_tunix.support.errors import warn_once
from otel_tunix.support.linefile import record_write_error

__all__ = ["DEFAULT_DIRECTORY", "PerfettoSpanExporter", "default_directory"]

logger = logging.getLogger(__name__)

DEFAULT_DIRECTORY: Final = Path("otel-tunix-runs") / "perfetto"
"""Directory used when neither the argument nor the environment names one."""


# --- the exporter ------------------------------------------------------------------------


def default_directory() -> Path:
    """Directory of the trace files when the constructor names none.

    Returns:
        ``$OTEL_TUNIX_PERFETTO_DIR``, else ``$OTEL_TUNIX_OUTPUT_DIR/perfetto`` (unless that
        is ``none``), else ``./otel-tunix-runs/perfetto``.
    """
    settings = load_settings()
    explicit = settings.perfetto_dir
    if explicit:
        return Path(explicit).expanduser()
    output = settings.output_dir
    if output and output.lower() != "none":
        return Path(output).expanduser() / "perfetto"
    return DEFAULT_DIRECTORY


class PerfettoSpanExporter(SpanExporter):
    """OTel span exporter that streams spans into a Perfetto ``.pftrace`` file.

    One file per exporter, created on the first export as
    ``trace-<host>-r<rank>-<pid>-<start unix ms>.pftrace`` (``-r<rank>`` only when the
    Resource has ``tunix.rank``; a ``-<n>`` suffix if the name is taken). Each export call
    appends its packets and hands them to the OS before returning.

    Registered as the ``perfetto`` entry point of ``opentelemetry_traces_exporter``, so
    ``OTEL_TRACES_EXPORTER=perfetto`` builds one with no arguments.

    Args:
        directory: Folder of the trace file; defaults to :func:`default_directory`.
        max_pending_spans: Spans held while waiting for their step span.
    """

    # Per-file state, (re)set by _reset_file_state (also in a forked child).
    _file: IO[bytes] | None
    _writer: PerfettoTraceWriter | None
    _path: Path | None
    _processes: dict[int, tuple[Resource, ProcessInfo]]

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        max_pending_spans: int = DEFAULT_MAX_PENDING_SPANS,
    ) -> None:
        self._directory = (
            Path(directory).expanduser() if directory is not None else default_directory()
        )
        self._max_pending = max_pending_spans
        self._lock = threading.Lock()
        self._reset_file_state()
        self._shutdown = False
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork_in_child)
            os.register_at_fork(after_in_child=_call_weak(ref))

    @property
    def directory(self) -> Path:
        """Folder the trace file goes to."""
        return self._directory

    def open_file(self, resource: Resource | None = None) -> Path | None:
        """Create the trace file now, with its header, named for ``resource`` (its rank), so
        that it exists from the run's start (else the first export creates it). Returns its
        path (``None`` after shutdown).

        Raises:
            OSError: the file cannot be made or written.
        """
        with self._lock:
            if self._shutdown:
                return None
            if self._file is None:
                self._create_file(resource)
            if self._writer is None:
                self._writer = PerfettoTraceWriter(
                    self._staging, max_pending_spans=self._max_pending
                )
                self._drain()
            return self._path

    @property
    def path(self) -> Path | None:
        """Path of the trace file, or ``None`` before the first export created it."""
        return self._path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append the spans to the trace file; never raises.

        Args:
            spans: Finished spans.

        Returns:
            ``SUCCESS``, or ``FAILURE`` after shutdown or on any error (logged once).
        """
        if self._shutdown:
            self._log_once("Perfetto exporter already shut down; spans dropped")
            return SpanExportResult.FAILURE
        try:
            with self._lock:
                if self._shutdown:
                    return SpanExportResult.FAILURE
                if not spans:
                    return SpanExportResult.SUCCESS
                writer = self._open(spans[0])
                try:
                    for span in spans:
                        writer.add(TraceSpan.from_readable_span(span, self._process_of(span)))
                finally:
                    self._drain()  # whole packets only, even if a span failed
        except OSError as exc:  # the file system (a full disk): in words, counted
            if self._path is None:  # the file could not even be made
                self._log_once(f"Perfetto exporter cannot make its trace file: {exc}")
            else:
                record_write_error(self._path, exc, len(spans))
            return SpanExportResult.FAILURE
        except Exception:
            self._log_once("Perfetto exporter failed to write spans", exc_info=True)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand everything written so far to the OS.

        Spans still waiting for their step span stay held (their step is not finished).

        Args:
            timeout_millis: Unused; writing is synchronous.

        Returns:
            ``True`` unless writing failed.
        """
        try:
            with self._lock:
                self._drain()
        except Exception:
            self._log_once("Perfetto exporter failed to flush", exc_info=True)
            return False
        return True

    def shutdown(self) -> None:
        """Write the held spans and close the file. Idempotent."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            try:
                if self._writer is not None:
                    self._writer.flush_pending()
                self._drain()
            except Exception:
                self._log_once("Perfetto exporter failed at shutdown", exc_info=True)
            finally:
                if self._file is not None:
                    with contextlib.suppress(OSError):
                        self._file.close()
                self._file = None
                self._writer = None

    # -- internals --

    def _reset_file_state(self) -> None:
        self._start_ms = time.time_ns() // 1_000_000
        self._pid = os.getpid()
        self._host = socket.gethostname()
        self._file = None
        self._size = 0  # bytes in the file: every batch written so far, whole
        self._staging = io.BytesIO()
        self._writer = None
        self._path = None
        self._processes = {}

    def _after_fork_in_child(self) -> None:
        # The child gets a file of its own; the inherited descriptor is the parent's.
        # The file is unbuffered, so dropping it loses nothing and writes nothing twice.
        self._lock = threading.Lock()
        self._reset_file_state()

    def _process_of(self, span: ReadableSpan) -> ProcessInfo:
        resource = span.resource
        cached = self._processes.get(id(resource))
        if cached is not None and cached[0] is resource:
            return cached[1]
        info = ProcessInfo.from_resource(resource, default_pid=self._pid, default_host=self._host)
        if len(self._processes) < 64:  # the entry keeps the Resource, so its id stays unique
            self._processes[id(resource)] = (resource, info)
        return info

    def _open(self, first: ReadableSpan) -> PerfettoTraceWriter:
        if self._writer is not None:
            return self._writer
        if self._file is None:
            self._create_file(first.resource)
        # A new writer starts with a fresh header (clock, sequence, track descriptors): also
        # after a failed write, when the old writer's state no longer matches the file.
        self._writer = PerfettoTraceWriter(self._staging, max_pending_spans=self._max_pending)
        return self._writer

    def _create_file(self, resource: Resource | None) -> None:
        rank = _as_int(resource.attributes.get(RANK)) if resource else None
        host = re.sub(r"[^A-Za-z0-9._-]+", "_", self._host)[:64] or "host"
        stem = f"trace-{host}{'-r' + str(rank) if rank is not None else ''}"
        stem = f"{stem}-{self._pid}-{self._start_ms}"
        self._directory.mkdir(parents=True, exist_ok=True)
        for attempt in range(1000):
            path = self._directory / f"{stem}{'-' + str(attempt) if attempt else ''}.pftrace"
            try:
                self._file = open(path, "xb", buffering=0)  # closed at shutdown
            except FileExistsError:
                continue
            self._path = path
            break
        else:
            raise FileExistsError(f"no free trace file name for {stem!r} in {self._directory}")
        logger.info("Perfetto trace: %s", self._path)

    def _drain(self) -> None:
        """Move the staged packets of this batch to the file in one write.

        A failed write is cut back to the last whole batch, so the file stays readable.
        """
        data = self._staging.getvalue()
        self._staging.seek(0)
        self._staging.truncate()
        if self._file is None or not data:
            return
        view = memoryview(data)
        written = 0
        try:
            while written < len(view):
                written += self._file.write(view[written:]) or 0
        except OSError:
            with contextlib.suppress(OSError):
                self._file.truncate(self._size)
                self._file.seek(self._size)
            self._writer = None  # what it wrote is gone: the next export starts afresh
            raise
        self._size += written

    def _log_once(self, message: str, *, exc_info: bool = False) -> None:
        """The exporter's first failure, logged as an error; later ones are not."""
        warn_once(
            (id(self), "failed"), message, logger=logger, level=logging.ERROR, exc_info=exc_info
        )


# --- small helpers -----------------------------------------------------------------------


def _call_weak(ref: weakref.WeakMethod[Callable[[], None]]) -> Callable[[], None]:
    def call() -> None:
        method = ref()
        if method is not None:
            method()

    return call
