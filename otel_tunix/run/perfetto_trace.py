"""The run folder's Perfetto trace: streamed during the run, or translated from the spans
JSONL when the run ends."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from otel_tunix import environment_variables as env
from otel_tunix._errors import report_internal_error
from otel_tunix._linefile import record_write_error
from otel_tunix._resource import RankInfo
from otel_tunix.config import PerformanceMetricsConfig
from otel_tunix.run.paths import checked_dir
from otel_tunix.settings import ConfigurationError, Settings

__all__ = ["PERFETTO_AT_SHUTDOWN", "perfetto_dir", "perfetto_from_jsonl"]

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


def perfetto_from_jsonl(spans: Path, rank: RankInfo) -> Path | None:
    """Translate the run folder's spans JSONL into ``trace[-rank<r>].pftrace``."""
    try:
        size = spans.stat().st_size
    except OSError:
        return None
    if size > MAX_SHUTDOWN_CONVERT_BYTES:
        _logger.info(
            "otel-tunix: %s is %d MB; make its Perfetto trace with: otel-tunix convert %s "
            "--to perfetto trace.pftrace",
            spans,
            size >> 20,
            spans,
        )
        return None
    from otel_tunix.exporters.perfetto import convert_jsonl_to_perfetto

    out = spans.with_name(f"trace{rank.file_suffix}.pftrace")
    try:
        convert_jsonl_to_perfetto(spans, out)
    except OSError as exc:  # the file system (a full disk): said in words, never raised
        record_write_error(out, exc, 0)
        return None
    except Exception:  # our converter, reading our own file
        report_internal_error("writing the Perfetto trace at shutdown")
        return None
    return out
