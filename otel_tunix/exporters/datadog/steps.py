"""Per-step DogStatsD ``distribution`` samples: :class:`DatadogStepSink`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Unpack

from opentelemetry.sdk.resources import Resource

from otel_tunix.consumers.step_accounting import StepSink
from otel_tunix.exporters.datadog.client import (
    DatadogClient,
    DatadogOptions,
    _Reporter,
    _resolve_client,
    _send,
)
from otel_tunix.exporters.datadog.tags import TagsLike, _tag_key, _tag_list, resource_tags
from otel_tunix.settings import attributes as attr

if TYPE_CHECKING:
    from otel_tunix.model.steps import ScopeSession, StepSummary

__all__ = [
    "COMPONENT_BLOCKED_TIME",
    "COMPONENT_BUSY_TIME",
    "STEP_BLOCKED_TIME",
    "STEP_BUSY_TIME",
    "STEP_DURATION",
    "STEP_IDLE_TIME",
    "DatadogStepSink",
]

STEP_DURATION: Final = "tunix.step.duration"
STEP_BUSY_TIME: Final = "tunix.step.busy_time"
STEP_BLOCKED_TIME: Final = "tunix.step.blocked_time"
STEP_IDLE_TIME: Final = "tunix.step.idle_time"
COMPONENT_BUSY_TIME: Final = "tunix.component.busy_time"
COMPONENT_BLOCKED_TIME: Final = "tunix.component.blocked_time"


class DatadogStepSink(StepSink):
    """Sends every sampled step's times as raw DogStatsD ``distribution`` samples.

    Datadog builds the distribution from every sample of every rank and host, so p50 / p95 /
    p99 of step and component times are exact, which OTel histograms cannot give over
    DogStatsD. Metrics (seconds): ``tunix.step.duration``, ``tunix.step.busy_time``,
    ``tunix.step.blocked_time``, ``tunix.step.idle_time`` tagged ``scope``, and
    ``tunix.component.busy_time`` / ``tunix.component.blocked_time`` tagged ``scope`` and
    ``component`` (only the kinds a component had in that step). No method raises.

    Args:
        client: A shared :class:`DatadogClient` (flushed, not closed, by :meth:`close`).
            Default: a new client from ``options`` and the environment.
        resource: The run's OTel resource; mapped to tags as in :func:`resource_tags`.
        tags: Extra tags on every sample.
        **options: :class:`DatadogOptions` for a new client.

    Raises:
        ValueError: ``client`` combined with options, or an invalid option.
    """

    def __init__(
        self,
        client: DatadogClient | None = None,
        *,
        resource: Resource | None = None,
        tags: TagsLike = None,
        **options: Unpack[DatadogOptions],
    ) -> None:
        self._client, self._owns_client = _resolve_client(client, options, "DatadogStepSink")
        extra = _tag_list(tags)
        taken = self._client.tag_keys() | {_tag_key(t) for t in extra}
        self._base_tags = extra + resource_tags(resource, exclude=taken)
        self._scope_tags: dict[str, list[str]] = {}
        self._component_tags: dict[tuple[str, str], list[str]] = {}
        self._report = _Reporter()
        self._closed = False

    @property
    def client(self) -> DatadogClient:
        """The DogStatsD client (for events and service checks)."""
        return self._client

    def on_step(self, summary: StepSummary) -> None:
        """Send the step's busy / blocked / idle times and its components' times."""
        if self._closed:
            return
        try:
            send = self._client.statsd.distribution
            scope = summary.scope
            tags = self._scope_tags.get(scope)
            if tags is None:
                tags = self._scope_tags.setdefault(
                    scope, [*self._base_tags, f"{attr.METRIC_SCOPE}:{scope}"]
                )
            _send(send, STEP_DURATION, summary.step_time_sec, tags)
            _send(send, STEP_BUSY_TIME, summary.busy_time_sec, tags)
            _send(send, STEP_BLOCKED_TIME, summary.blocked_time_sec, tags)
            _send(send, STEP_IDLE_TIME, summary.idle_time_sec, tags)
            kinds: dict[str, set[str]] = {}
            for span in summary.spans:
                kinds.setdefault(span.name, set()).add(span.kind)
            for component, (busy, blocked, _) in summary.component_times.items():
                ctags = self._component_tags.get((scope, component))
                if ctags is None:
                    ctags = self._component_tags.setdefault(
                        (scope, component), [*tags, f"{attr.METRIC_COMPONENT}:{component}"]
                    )
                seen = kinds.get(component)
                if seen is None:  # no span list: infer the kinds from the times
                    seen = set()
                    if busy > 0 or blocked == 0:
                        seen.add(attr.KIND_BUSY)
                    if blocked > 0:
                        seen.add(attr.KIND_BLOCKED)
                if attr.KIND_BUSY in seen:
                    _send(send, COMPONENT_BUSY_TIME, busy, ctags)
                if attr.KIND_BLOCKED in seen:
                    _send(send, COMPONENT_BLOCKED_TIME, blocked, ctags)
        except Exception:
            self._report("on_step", "Datadog step sink failed to send a step", exc_info=True)

    def on_session(self, sessions: list[ScopeSession]) -> None:
        """Nothing to send: session totals are sums of the per-step samples already sent."""
        return None

    def close(self) -> None:
        """Flush and, if this sink created its client, stop it (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self._client.close()
        else:
            self._client.flush()
