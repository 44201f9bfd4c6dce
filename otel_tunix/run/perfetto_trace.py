"""The run folder's Perfetto trace: streamed during the run, or translated from the spans
JSONL when the run ends, in the time its shutdown has left (what does not fit is left to
``otel-tunix convert``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from otel_tunix.model.resource import RankInfo
from otel_tunix.run.paths import checked_dir
from otel_tunix.settings import variables as env
from otel_tunix.settings.config import PerformanceMetricsConfig
from otel_tunix.settings.parsing import ConfigurationError
from otel_tunix.settings.values import Settings
from otel_tunix.support.errors import report_internal_error
from otel_tunix.support.linefile import record_write_error

__all__ = [
    "PERFETTO_AT_SHUTDOWN",
    "convert_hint",
    "perfetto_dir",
    "perfetto_from_jsonl",
    "trace_name",
]

_logger = logging.getLogger(__name__)


PERFETTO_AT_SHUTDOWN = "shutdown"
"""``perfetto_dir`` answer for the default: translate the spans JSONL when the run ends."""

MAX_SHUTDOWN_CONVERT_BYTES = 256 * 2**20
"""A spans JSONL larger than this is left for ``otel-tunix convert`` instead of being
translated while the program exits."""


def perfetto_dir(
    cfg: PerformanceMetricsConfig, out_dir: Path | None, settings: Settings
) -> Path | str | None:
    """Where the Perfetto trace goes.

    ``perfetto_trace_dir`` / ``OTEL_TUNIX_PERFETTO_DIR`` stream it during the run (``none``
    turns it off). By default the local run folder gets one translated from its spans JSONL
    at ``shutdown()`` (``PERFETTO_AT_SHUTDOWN``), when the ``perfetto`` package is
    installed: the translation costs tens of microseconds per span, which the training loop
    should not pay. ``OTEL_TRACES_EXPORTER=perfetto`` builds its own exporter instead.
    """
    if "perfetto" in (settings.traces_exporter or ()):
        return None
    raw = cfg.perfetto_trace_dir
    if raw is not None:
        text = os.fspath(raw)
        if text.strip().lower() == "none":
            return None
        try:
            import perfetto
        except ImportError as exc:
            raise ConfigurationError(
                f"perfetto_trace_dir / {env.OTEL_TUNIX_PERFETTO_DIR} needs pip install "
                f"'otel-tunix[perfetto]' ({exc})"
            ) from exc
        return checked_dir(text, "perfetto_trace_dir / " + env.OTEL_TUNIX_PERFETTO_DIR)
    if out_dir is None:
        return None
    try:
        import perfetto  # noqa: F401
    except ImportError:
        return None
    return PERFETTO_AT_SHUTDOWN


def perfetto_from_jsonl(
    spans: Path, rank: RankInfo, *, deadline: float | None = None
) -> Path | None:
    """Translate the run folder's spans JSONL into ``trace[-rank<r>].pftrace``, stopping at
    ``deadline`` (``time.monotonic()``): a trace that did not fit is not written (no part
    of one is left) and ``None`` is returned, as for a file too large to try."""
    try:
        size = spans.stat().st_size
    except OSError:
        return None
    if size > MAX_SHUTDOWN_CONVERT_BYTES:
        _logger.info("otel-tunix: %s is %d MB: %s", spans, size >> 20, convert_hint(spans, rank))
        return None
    from otel_tunix.exporters.perfetto import ConversionTimeout, convert_jsonl_to_perfetto

    out = spans.with_name(trace_name(rank))
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)  # a link left at that name is removed, never followed
        convert_jsonl_to_perfetto(spans, tmp, deadline=deadline)
        tmp.replace(out)
    except ConversionTimeout:
        tmp.unlink(missing_ok=True)
        return None
    except OSError as exc:  # the file system (a full disk): said in words, never raised
        tmp.unlink(missing_ok=True)
        record_write_error(out, exc, 0)
        return None
    except Exception:  # our converter, reading our own file
        tmp.unlink(missing_ok=True)
        report_internal_error("writing the Perfetto trace at shutdown")
        return None
    return out


def trace_name(rank: RankInfo) -> str:
    """The name of the run folder's Perfetto trace."""
    return f"trace{rank.file_suffix}.pftrace"


def convert_hint(spans: Path, rank: RankInfo) -> str:
    """The command that makes the Perfetto trace of ``spans``."""
    return f"otel-tunix convert {spans} --to perfetto {spans.with_name(trace_name(rank))}"
