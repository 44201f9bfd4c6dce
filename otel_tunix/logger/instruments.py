"""OTel instruments made from the catalog, and a catalog-driven MetricsLogger backend.

:class:`CatalogInstruments` creates each catalog instrument once per meter (name, kind, unit,
description and histogram boundaries from :mod:`otel_tunix.model.catalog`) and records
values with the row's constant attributes. The generation and system metrics use it, so
every instrument otel-tunix records comes from the one table.

:class:`CatalogOTelBackend` is a MetricsLogger backend that replaces the one-gauge-per-name
:class:`otel_tunix.logger.metrics_logger.OTelBackend`: a logged name found in the catalog goes to
its catalogued instrument (``rewards/mean`` -> gauge ``tunix.rl.reward.mean``,
``actor_dequeue_time`` -> histogram ``tunix.rl.actor.dequeue_time`` in ``s``,
``rewards/format`` -> gauge ``tunix.rl.reward.function{reward_fn="format"}``); any other
name becomes a gauge with a dotted name and a unit guessed from its suffix.
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from otel_tunix.logger.backend import PERF_SOURCE, LoggingBackend, otel_metric_name
from otel_tunix.model.catalog import CATALOG, by_otel_name, guess_unit, lookup
from otel_tunix.model.metric_spec import Instrument, MetricSpec
from otel_tunix.recording.current_run import meter as current_meter
from otel_tunix.settings.version import __version__

__all__ = [
    "METER_SCOPE",
    "CatalogInstruments",
    "CatalogOTelBackend",
    "create_observable",
    "observable",
]

_logger = logging.getLogger(__name__)

METER_SCOPE = "otel_tunix.metrics"
"""Instrumentation scope (meter name) of the catalog instruments."""

_CATALOG_NAMES = frozenset(s.otel_name for s in CATALOG)


def _meter(meter_provider: MeterProvider | None) -> Meter:
    """A meter of ``meter_provider``, else of the current run's provider (the global one
    before ``configure()``)."""
    if meter_provider is not None:
        return meter_provider.get_meter(METER_SCOPE, __version__)
    return current_meter(METER_SCOPE)


def _create(meter: Meter, spec: MetricSpec) -> Any:
    name, unit, desc = spec.otel_name, spec.unit, spec.description
    if spec.instrument is Instrument.GAUGE:
        return meter.create_gauge(name, unit=unit, description=desc)
    if spec.instrument is Instrument.COUNTER:
        return meter.create_counter(name, unit=unit, description=desc)
    if spec.instrument is Instrument.UP_DOWN_COUNTER:
        return meter.create_up_down_counter(name, unit=unit, description=desc)
    return meter.create_histogram(
        name,
        unit=unit,
        description=desc,
        explicit_bucket_boundaries_advisory=list(spec.buckets) if spec.buckets else None,
    )


ObservableCallback = Callable[[CallbackOptions], Sequence[Observation]]


class _Slot:
    """The callback an observable instrument reads now (``None``: nothing to report)."""

    __slots__ = ("__weakref__", "callback")

    def __init__(self, callback: ObservableCallback | None) -> None:
        self.callback = callback


_observed: weakref.WeakKeyDictionary[Any, dict[str, weakref.ref[_Slot]]] = (
    weakref.WeakKeyDictionary()
)
"""Per meter and instrument name: the slot its observable instrument reads. Weakly on both
sides: the instrument's own callback holds the slot, and a slot's callback usually reaches
its meter (a run's state holds its meter provider), so a strong slot here would keep every
meter, and every run's state, alive for good."""
_observed_lock = threading.Lock()


def observable(
    meter: Meter,
    kind: Instrument,
    name: str,
    callback: ObservableCallback | None,
    *,
    unit: str = "",
    description: str = "",
) -> None:
    """An observable instrument (gauge, counter or up-down counter) reading ``callback``.

    Made once per meter and name; a later call for the same meter and name (a later run, a
    new sampler on the same provider) makes the instrument read its ``callback`` instead,
    and ``None`` leaves it nothing to report. The SDK hands back the first instrument of a
    name and keeps calling the callbacks it was made with, so without this the first run or
    sampler would answer, stale, for every later one.
    """
    with _observed_lock:
        try:
            names = _observed.setdefault(meter, {})
        except TypeError:  # a meter that cannot be weakly referenced: no replacing
            names = {}
        ref = names.get(name)
        slot = ref() if ref is not None else None
        if slot is not None:
            slot.callback = callback
            return
        if callback is None:  # nothing made yet, nothing to report
            return
        slot = _Slot(callback)
        names[name] = weakref.ref(slot)

    def observe(options: CallbackOptions) -> Sequence[Observation]:
        current = slot.callback
        return current(options) if current is not None else ()

    if kind is Instrument.GAUGE:
        meter.create_observable_gauge(name, [observe], unit=unit, description=description)
    elif kind is Instrument.COUNTER:
        meter.create_observable_counter(name, [observe], unit=unit, description=description)
    elif kind is Instrument.UP_DOWN_COUNTER:
        meter.create_observable_up_down_counter(name, [observe], unit=unit, description=description)
    else:
        raise ValueError(f"{name} is a histogram; histograms cannot be observable")


def create_observable(meter: Meter, spec: MetricSpec, callback: ObservableCallback) -> None:
    """The observable instrument of a catalog row (see :func:`observable`); observations
    get the row's constant attributes added."""
    const = dict(spec.attributes)

    def with_const(options: CallbackOptions) -> list[Observation]:
        out = []
        for obs in callback(options):
            attrs = {**const, **(obs.attributes or {})} if const else obs.attributes
            out.append(Observation(obs.value, attrs))
        return out

    observable(
        meter,
        spec.instrument,
        spec.otel_name,
        with_const,
        unit=spec.unit,
        description=spec.description,
    )


class CatalogInstruments:
    """Synchronous instruments of catalog rows on one meter, created on first use.

    Args:
        meter_provider: The provider to use; default: the current run's (the global one
            before ``configure()``).
        meter: A meter to use instead of one from the provider.
    """

    def __init__(
        self, meter_provider: MeterProvider | None = None, *, meter: Meter | None = None
    ) -> None:
        self.meter = meter or _meter(meter_provider)
        self._instruments: dict[str, Any] = {}
        self._lock = threading.Lock()

    def instrument(self, spec: MetricSpec | str) -> Any:
        """The instrument of a catalog row (or its OTel name)."""
        if isinstance(spec, str):
            spec = by_otel_name(spec)
        inst = self._instruments.get(spec.otel_name)
        if inst is None:
            with self._lock:
                inst = self._instruments.get(spec.otel_name)
                if inst is None:
                    inst = self._instruments[spec.otel_name] = _create(self.meter, spec)
        return inst

    def record(
        self,
        spec: MetricSpec | str,
        value: float,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """Record ``value`` (times the row's scale) with the row's constant attributes.

        Gauges are set, counters and up-down counters add ``value``, histograms record it.
        """
        if isinstance(spec, str):
            spec = by_otel_name(spec)
        inst = self.instrument(spec)
        attrs = {**spec.attributes, **attributes} if attributes else dict(spec.attributes)
        v = value * spec.scale if spec.scale != 1.0 else value
        kind = spec.instrument
        if kind is Instrument.GAUGE:
            inst.set(v, attrs)
        elif kind is Instrument.HISTOGRAM:
            inst.record(v, attrs)
        else:
            inst.add(v, attrs)


class CatalogOTelBackend(LoggingBackend):
    """MetricsLogger backend: each logged scalar goes to its catalogued OTel instrument.

    * A catalogued name uses the row's instrument: gauges are set to the logged value,
      histograms record it, counters add it (a logged counter value is an increment).
    * Any other name becomes a gauge: ``/`` turned into ``.``, unit from
      :func:`~otel_tunix.model.catalog.guess_unit`; a name that would equal a catalog
      instrument is put under ``tunix.logged.`` so nothing collapses.
    * ``perf/...`` scalars (``source="perf"``) are skipped: the accounting processor
      publishes them as histograms already. NaN and Inf are skipped too: the SDK would drop
      them with a warning per value (the MetricsLogger already warns once per name, and the
      ``loss_not_finite`` alert reports a diverged loss).

    Use it through ``MetricsLoggerOptions(default_backends=False, backend_factories=[...])``
    or as the core's OTel backend (see the report of issue 5).

    Args:
        meter_provider: The provider; default: the current run's (the global one before
            ``configure()``).
    """

    skip_sources = (PERF_SOURCE,)

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        self._instruments = CatalogInstruments(meter_provider)
        self._gauges: dict[str, Any] = {}
        self._routes: dict[str, tuple[MetricSpec | None, Mapping[str, str]]] = {}

    def _route(self, event: str) -> tuple[MetricSpec | None, Mapping[str, str]]:
        route = self._routes.get(event)
        if route is None:
            m = lookup(event)
            route = self._routes[event] = (m.spec, m.attributes) if m else (None, {})
        return route

    def log_scalar(self, event: str, value: float, **kwargs: Any) -> None:
        """Record one scalar (``kwargs``: ``step``, ``source``)."""
        if kwargs.get("source") in self.skip_sources or not math.isfinite(value):
            return
        spec, attrs = self._route(event)
        if spec is None:
            gauge = self._gauges.get(event)
            if gauge is None:
                name = otel_metric_name(event.replace("/", "."))
                if name in _CATALOG_NAMES:
                    name = "tunix.logged." + name
                gauge = self._gauges[event] = self._instruments.meter.create_gauge(
                    name, unit=guess_unit(event), description=f"logged as {event}"
                )
            gauge.set(value)
            return
        self._instruments.record(spec, value, attrs)

    def log_scalars(self, values: Mapping[str, float], **kwargs: Any) -> None:
        """Record several scalars of one step."""
        for event, value in values.items():
            self.log_scalar(event, value, **kwargs)

    def close(self) -> None:
        """Nothing to release (the meter provider owns the instruments)."""
        return None
