"""Tunix's scalars as OTel instruments: :class:`TunixMetric` (event-name parsing) and
:class:`OTelLoggingBackend` (a metrax logging backend). Re-exported by
:mod:`otel_tunix.instrumentation.tunix`.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from typing import Any

from opentelemetry.metrics import NoOpMeter

import otel_tunix
from otel_tunix.instrumentation.jax import run_meter
from otel_tunix.logger.backend import PERF_SOURCE, LoggingBackend, to_scalar
from otel_tunix.model.catalog import lookup
from otel_tunix.model.metric_spec import MODE_ATTRIBUTE, SECONDS_BUCKETS
from otel_tunix.support.errors import warn_once

_logger = logging.getLogger("otel_tunix.instrumentation.tunix")  # the public module's logger


# --- the metrics backend -------------------------------------------------------------------

MODES = ("train", "eval")

CATEGORIES = frozenset(
    {
        "advantages",
        "clip_ratio",
        "completions",
        "loss",
        "objective",
        "perf",
        "policy",
        "returns",
        "reward",
        "rewards",
        "sample",
        "score",
        "scores",
        "val",
        "values",
    }
)
"""First name parts that Tunix's RL cluster splits off as a "prefix" but that belong to the
metric name (``rewards/mean`` is logged as ``rewards/train/mean``). Other prefixes are
trainer roles (``actor``, ``critic``, a ``metrics_prefix``)."""


PREFIX_ATTRIBUTE = "tunix.metrics.prefix"
"""Tunix's attribute for a MetricsLogger's ``metrics_prefix`` (a trainer role: ``actor``)."""

TUNIX_NAMED = {
    name: spec.spec.otel_name
    for name in ("loss", "perplexity", "learning_rate", "grad_norm")
    if (spec := lookup(name)) is not None
}
"""The metrics to which Tunix's own MetricsLogger gives fixed OTel names (its
``_OTEL_KNOWN_METRICS``): the catalog's rows, so both writers name one series alike."""


class TunixMetric:
    """A Tunix scalar event, parsed: ``<prefix>/<mode>/<name>``."""

    __slots__ = ("mode", "name", "role")

    def __init__(self, name: str, mode: str | None, role: str | None) -> None:
        self.name = name
        self.mode = mode
        self.role = role

    @property
    def instrument_name(self) -> str:
        """Tunix's own name for the four it names (``tunix.training.loss``), else ``tunix.``
        + the name normalised as Tunix's MetricsLogger does (lowercase, each run of other
        characters than ``[a-z0-9_.-]`` one ``.``: ``rewards/score mean`` ->
        ``tunix.rewards.score.mean``). A category prefix stays in the name
        (``tunix.rewards.mean``), where Tunix puts it in ``tunix.metrics.prefix``."""
        named = TUNIX_NAMED.get(self.name)
        if named is not None:
            return named
        return ("tunix." + (_NOT_NAME.sub(".", self.name).strip(".").lower() or "unnamed"))[:255]

    @property
    def logger_name(self) -> str:
        """Slash-style name for otel-tunix's MetricsLogger (``loss``, ``eval/loss``,
        ``actor/kl``)."""
        parts = [p for p in (self.role, "eval" if self.mode == "eval" else None) if p]
        return "/".join([*parts, self.name])

    @property
    def unit(self) -> str:
        """The UCUM unit: ``s`` for times, ``{token}`` for lengths, else ``1``."""
        leaf = self.name.rsplit("/", 1)[-1]
        if self.name.startswith("perf/") or leaf.endswith(
            ("_time", "_sec", "_secs", "_seconds", "_time_sec")
        ):
            return "s"
        if leaf.endswith("per_sec"):
            return "1/s"
        if "length" in leaf or "tokens" in leaf:
            return "{token}"
        return "1"

    @property
    def logged_late(self) -> bool:
        """Tunix's RL perf metrics (``perf/global_step_time``, ...): Tunix logs a global
        step's after counting it, at the next step's number."""
        return self.role is None and self.name.startswith("perf/")

    @property
    def attributes(self) -> dict[str, str]:
        """Tunix's attributes: ``tunix.training.mode`` and, for a role,
        ``tunix.metrics.prefix``."""
        attrs = {MODE_ATTRIBUTE: self.mode or "train"}
        if self.role:
            attrs[PREFIX_ATTRIBUTE] = self.role
        return attrs

    def __repr__(self) -> str:
        return f"TunixMetric({self.name!r}, mode={self.mode!r}, role={self.role!r})"


_NOT_NAME = re.compile(r"[^A-Za-z0-9_.\-]+")


def parse_event(event: str) -> TunixMetric:
    """Parse Tunix's ``f"{metrics_prefix}/{mode}/{name}"`` event names.

    ``/train/loss`` -> ``loss`` (train); ``actor/train/kl`` -> ``kl`` (train, role actor);
    ``rewards/eval/mean`` -> ``rewards/mean`` (eval); ``global/train/kl`` -> ``kl``. Anything
    else is taken as a plain name.
    """
    parts = event.split("/")
    if len(parts) >= 3 and parts[1] in MODES:
        prefix, mode, name = parts[0], parts[1], "/".join(parts[2:])
        if prefix in ("", "global"):
            return TunixMetric(name, mode, None)
        if prefix in CATEGORIES:
            return TunixMetric(f"{prefix}/{name}", mode, None)
        return TunixMetric(name, mode, prefix)
    return TunixMetric(event.strip("/") or event, None, None)


_live_backends: list[OTelLoggingBackend] = []
_live_lock = threading.Lock()


class OTelLoggingBackend(LoggingBackend):
    """A metrax ``LoggingBackend`` that publishes Tunix's scalars as OTel instruments.

    Tunix's ``MetricsLogger`` hands every backend to ``jax.monitoring`` as a scalar
    listener, so each backend sees every Tunix metric of the process (and JAX's own
    ``/jax/...`` scalars, which are ignored). When several are alive, only the oldest
    publishes, so nothing is counted twice.

    Times (unit ``s``) become histograms, everything else gauges (last value per
    ``tunix.training.mode`` / ``tunix.metrics.prefix``). Each scalar is also logged to
    otel-tunix's MetricsLogger under its slash-style name (``loss``, ``eval/loss``,
    ``actor/kl``) at the step of the work it describes: Tunix's own step, except for its RL
    ``perf/...`` metrics, which Tunix logs one global step late (see
    :attr:`TunixMetric.logged_late`). Never raises.

    Args:
        forward: Also log to otel-tunix's MetricsLogger (``metrics.jsonl``, console).
        meter_provider: Where the instruments live (default: the otel-tunix run's).
    """

    def __init__(self, *, forward: bool = True, meter_provider: Any = None) -> None:
        self._forward = forward
        self._provider = meter_provider
        self._meter: Any = None
        self._meter_from: Any = None
        self._instruments: dict[str, Any] = {}
        self._parsed: dict[str, TunixMetric] = {}
        self._closed = False
        with _live_lock:
            _live_backends.append(self)

    def _instrument(self, metric: TunixMetric) -> Any:
        meter = self._current_meter()
        key = metric.instrument_name
        inst = self._instruments.get(key)
        if inst is None:
            unit = metric.unit
            desc = f"Tunix metric {metric.name}"
            if unit == "s":
                inst = meter.create_histogram(
                    key,
                    unit=unit,
                    description=desc,
                    explicit_bucket_boundaries_advisory=list(SECONDS_BUCKETS),
                )
            else:
                inst = meter.create_gauge(key, unit=unit, description=desc)
            self._instruments[key] = inst
        return inst

    def _current_meter(self) -> Any:
        if self._provider is not None:
            if self._meter is None:
                self._meter = self._provider.get_meter(
                    "otel_tunix.instrumentation.tunix", otel_tunix.__version__
                )
            return self._meter
        source = otel_tunix.current_run()
        if self._meter is None or source is not self._meter_from:
            self._meter = run_meter("otel_tunix.instrumentation.tunix")
            self._meter_from = source
            self._instruments = {}
        return self._meter

    def log_scalar(self, event: str, value: Any, **kwargs: Any) -> None:
        """Publish one Tunix scalar (``kwargs`` carries ``step``)."""
        if self._closed or event.startswith("/jax/"):
            return
        try:
            if _live_backends and _live_backends[0] is not self:
                return
            metric = self._parsed.get(event)
            if metric is None:
                metric = self._parsed[event] = parse_event(event)
            try:
                v = to_scalar(value)
            except Exception as exc:
                self._warn_once(event, "otel-tunix: Tunix metric %r skipped: %s", event, exc)
                return
            inst = self._instrument(metric)
            if math.isfinite(v):
                if metric.unit == "s":
                    inst.record(v, metric.attributes)
                else:
                    inst.set(v, metric.attributes)
            if self._forward:
                step = kwargs.get("step")
                if step is not None and metric.logged_late and int(step) > 0:
                    step = int(step) - 1  # the global step they describe: its span's number
                otel_tunix.get_metrics_logger().log(
                    metric.logger_name,
                    v,
                    step=int(step) if step is not None else None,
                    source=PERF_SOURCE,  # already an OTel instrument: OTelBackend skips it
                )
        except Exception:
            self._warn_once("!" + event, "otel-tunix: Tunix metric %r failed", event)

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        warn_once(
            (id(self), key),
            msg,
            *args,
            logger=_logger,
            exc_info=_logger.isEnabledFor(logging.DEBUG),
        )

    @property
    def publishing(self) -> bool:
        """Whether this backend is the one that publishes (the oldest alive)."""
        with _live_lock:
            return bool(_live_backends) and _live_backends[0] is self and not self._closed

    def close(self) -> None:
        """Stop publishing (Tunix calls it when its MetricsLogger closes)."""
        self._closed = True
        with _live_lock:
            if self in _live_backends:
                _live_backends.remove(self)


# --- Tunix's own OpenTelemetry double-write ---------------------------------------------------

STEP_GAUGE = "tunix.training.step"
"""The one instrument of Tunix's own OpenTelemetry path (``MetricsLoggerOptions(
enable_opentelemetry=True)``, Tunix after 0.1.7) whose value otel-tunix does not publish:
the logical step per ``tunix.training.mode`` / ``tunix.metrics.prefix``."""


class StepGaugeOnly:
    """Tunix's meter, for a MetricsLogger whose scalars an :class:`OTelLoggingBackend`
    publishes: only :data:`STEP_GAUGE` reaches Tunix's meter (its own scope ``tunix``),
    every other gauge Tunix creates records nothing, so each value reaches the collector
    once (otel-tunix's instrument, with its unit), never a second time from Tunix."""

    def __init__(self, meter: Any) -> None:
        self.meter = meter

    def create_gauge(self, name: str, unit: str = "", description: str = "") -> Any:
        """The real gauge for :data:`STEP_GAUGE`, else a no-op one."""
        if name == STEP_GAUGE:
            return self.meter.create_gauge(name, unit=unit, description=description)
        return NoOpMeter("tunix").create_gauge(name, unit=unit, description=description)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.meter, name)
