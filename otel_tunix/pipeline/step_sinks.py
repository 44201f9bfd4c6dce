"""The one consumer interface, and the worker's list of consumers.

Everything that consumes otel-tunix's finished steps is a :class:`StepSink`: the
accounting processor (session totals), the OTel instruments and step histograms, the
MetricsLogger's ``perf/...`` scalars, the spans JSONL writer, an export function,
DogStatsD, the slowest steps, stragglers, the live goodput ledger, the export processors
(they take steps whole) and the application's sinks. Every hook is declared on the base
class with a do-nothing default, as the OTel SDK's ``SpanProcessor`` does; a consumer
overrides the hooks it needs, at the level it needs (whole steps, or their summaries).
Contract: a hook must not raise (one that raises is reported once and the others go on) and
should not block.

Run setup gives the worker one :class:`Consumers` list; the span builder hands each batch of
steps, background spans and outside spans to it, and it calls each consumer in order. A
consumer that is not otel-tunix's own (``runs_user_code``) runs on a thread of its own
(:mod:`otel_tunix.pipeline.hooks`): each hook call is queued, whatever hook it is. Nothing
is delivered through the SDK's private processor tuple: span processors that are not
consumers (an application's ``SimpleSpanProcessor``, a ``span_processors=`` one) get the
steps' SDK spans through ``on_end`` from :class:`ProviderSpans`, one of the list, each
processor on a thread of its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from otel_tunix.model.steps import ScopeSession, StepSummary
from otel_tunix.pipeline.hooks import (
    HookRunner,
    close_hooks,
    closing_threads,
    flush_hooks,
    runs_user_code,
)
from otel_tunix.support.errors import ReportOnce, warn_once
from otel_tunix.support.shortcuts import span_processors_found

if TYPE_CHECKING:
    from otel_tunix.pipeline.background import BackgroundSpan
    from otel_tunix.pipeline.outside import OutsideSpan
    from otel_tunix.pipeline.span_builder import FinishedStep

__all__ = ["Consumers", "ProviderSpans", "StepSink", "StepSpanProcessor"]

_logger = logging.getLogger(__name__)


class StepSink:
    """Base class of everything that consumes otel-tunix's finished steps.

    Every hook is declared here with a default; a consumer overrides what it needs. The
    hooks are called in this order over a run: ``on_finished_steps`` (which by default
    hands the steps' summaries to ``on_steps``, which by default calls ``on_step`` for
    each), ``on_background_spans`` and ``on_outside_spans`` as they come, ``flush`` after
    each batch, then ``on_session`` and ``close`` at the end. Contract: hooks must not raise
    (one that raises is reported once and the other consumers go on) and should not block
    for long. otel-tunix's own consumers run on its worker thread; any other
    (``configure(step_sinks=)``, a ``span_processors=`` one that is a ``StepSink``, a class
    whose ``runs_user_code`` is true) runs on a thread of its own, so that whatever it does,
    the worker, the training loop and the shutdown budget hold.
    """

    runs_user_code = False
    """True for a consumer of otel-tunix's that calls the user's code (it then runs on a
    thread of its own, as the user's consumers do)."""

    def on_finished_steps(self, steps: Sequence[FinishedStep]) -> None:
        """A batch of finished sampled steps, in order (:class:`FinishedStep`: numbers
        now, SDK spans on demand). Default: their summaries to :meth:`on_steps`."""
        self.on_steps([step.summary for step in steps])

    def on_steps(self, summaries: Sequence[StepSummary]) -> None:
        """The summaries of one batch of steps, in order. Default: :meth:`on_step` for
        each; a step that raises does not lose the others (the first error is raised at the
        end, for the list to report)."""
        error: Exception | None = None
        for summary in summaries:
            try:
                self.on_step(summary)
            except Exception as exc:  # the sink's code: raised below, the list reports it
                error = error or exc
        if error is not None:
            raise error

    def on_step(self, summary: StepSummary) -> None:
        """One sampled step finished. Default: nothing."""

    def on_background_spans(self, spans: Sequence[BackgroundSpan]) -> None:
        """Spans of other threads' work that ended after their step was processed (an async
        checkpoint writer's), each with its step's scope, number and trace id; their time
        is already in the steps they overlap. Default: nothing."""

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        """Components recorded outside any step (a checkpoint restore before the loop, an
        evaluation between steps, a writer after the last step), each ended record at once:
        its nested components in start order, then its root
        (:class:`~otel_tunix.pipeline.outside.OutsideSpan`: name, kind, Unix-ns times,
        trace / span / parent ids, thread, declared ``category``; ``info()``, ``span()``).
        No step counts them: a consumer that keeps time by goodput category (the live
        ledger) takes the time outside the steps from here. Default: nothing."""

    def flush(self) -> None:
        """After each batch of steps: hand buffered output on. Default: nothing."""

    def on_session(self, sessions: list[ScopeSession]) -> None:
        """The session ends (``otel_tunix.shutdown()``): totals per scope. Default:
        nothing."""

    def close(self) -> None:
        """Release files and clients (after :meth:`on_session`). Default: nothing."""


class StepSpanProcessor(StepSink, SpanProcessor):
    """A consumer that is also an SDK ``SpanProcessor``: given as
    ``configure(span_processors=[...])`` it is added to the tracer provider (other code's
    spans, through ``on_end``) and to the worker's consumers (otel-tunix's steps whole).
    Its defaults hand each SDK span of otel-tunix's steps to ``on_end``; override
    :meth:`on_finished_steps` (and the other hooks) to take them whole instead."""

    def on_finished_steps(self, steps: Sequence[FinishedStep]) -> None:
        """Finished steps, in order. Default: each span of each step to ``on_end``."""
        for step in steps:
            for span in step.spans():
                self.on_end(span)

    def on_background_spans(self, spans: Sequence[BackgroundSpan]) -> None:
        """Default: each one's SDK span to ``on_end``."""
        for span in spans:
            self.on_end(span.span())

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        """Default: each one's SDK span to ``on_end``."""
        for span in spans:
            self.on_end(span.span())


class ProviderSpans(StepSink):
    """The adapter for the span processors of the tracer provider that are not among the
    run's consumers (an application's ``SimpleSpanProcessor``, a ``span_processors=`` one):
    the SDK spans of otel-tunix's steps (components in start order, then the step span),
    background and outside spans to ``on_end`` of each (a :class:`StepSpanProcessor` added
    to the provider directly gets the steps whole instead), each on a thread of its own (a
    blocking ``on_end`` holds no step back; what it had not been given when the run ends is
    counted).

    The processors are looked up on the provider at each batch (one added later is picked
    up); where the SDK's processor tuple cannot be read, ``known`` (those given to
    ``configure``) get them, and a warning says that any other processor does not.

    Args:
        provider: The tracer provider.
        known: The span processors given to ``configure(span_processors=)``.
        consumers: The run's consumers (those among them get nothing from here).
    """

    def __init__(
        self,
        provider: Any,
        known: Iterable[SpanProcessor] = (),
        consumers: Consumers | None = None,
    ) -> None:
        self._provider = provider
        self._consumers = consumers
        self._known = tuple(p for p in known if not isinstance(p, StepSink))
        self._runners: dict[int, tuple[SpanProcessor, HookRunner]] = {}
        self._lock = threading.Lock()
        self._report = ReportOnce(_logger)

    def targets(self) -> list[SpanProcessor]:
        """The processors that get the spans now."""
        found = span_processors_found(self._provider)
        if found is None:
            warn_once(
                "no-processor-tuple",
                "otel-tunix: the tracer provider's span processors cannot be read; "
                "otel-tunix's spans go to the span_processors given to configure() only, "
                "not to processors added to the provider otherwise",
                logger=_logger,
            )
            found = self._known
        if not found:
            return []
        ours = {id(c) for c in self._consumers.sinks} if self._consumers is not None else set()
        return [p for p in found if id(p) not in ours]

    def runners(self) -> list[HookRunner]:
        """One hook runner per processor that got spans."""
        with self._lock:
            return [runner for _, runner in self._runners.values()]

    def _runner(self, proc: SpanProcessor) -> HookRunner:
        entry = self._runners.get(id(proc))
        if entry is None or entry[0] is not proc:
            with self._lock:
                name = f"span processor {type(proc).__name__}"
                report = _reporter(self._report, proc)
                entry = self._runners[id(proc)] = (proc, HookRunner(name, report, unit="steps"))
        return entry[1]

    def on_finished_steps(self, steps: Sequence[FinishedStep]) -> None:
        for proc in self.targets():
            if isinstance(proc, StepSink):
                self._runner(proc).call_items(len(steps), proc.on_finished_steps, steps)
            else:
                self._runner(proc).call_items(len(steps), _steps_to_on_end, proc.on_end, steps)

    def on_background_spans(self, spans: Sequence[BackgroundSpan]) -> None:
        self._spans("on_background_spans", spans)

    def on_outside_spans(self, spans: Sequence[OutsideSpan]) -> None:
        self._spans("on_outside_spans", spans)

    def _spans(self, hook: str, spans: Sequence[BackgroundSpan | OutsideSpan]) -> None:
        for proc in self.targets():
            if isinstance(proc, StepSink):
                self._runner(proc).call(getattr(proc, hook), spans)
            else:
                self._runner(proc).call(_spans_to_on_end, proc.on_end, spans)


def _reporter(report: ReportOnce, proc: SpanProcessor) -> Callable[[str], None]:
    def failed(method: str) -> None:
        report(
            id(proc),
            "otel-tunix: span processor %s raised (reported once; the run goes on)",
            type(proc).__name__,
        )

    return failed


def _steps_to_on_end(on_end: Callable[[ReadableSpan], object], steps: Sequence[Any]) -> None:
    for step in steps:
        for span in step.spans():
            on_end(span)


def _spans_to_on_end(on_end: Callable[[ReadableSpan], object], spans: Sequence[Any]) -> None:
    for span in spans:
        on_end(span.span())


class Consumers:
    """The worker's consumers, in order: each hook call goes to every one (a user's on its
    own thread); one that raises is reported once and the others go on.

    Args:
        consumers: The first ones (more with :meth:`add`, also while the run goes on).
    """

    def __init__(self, consumers: Iterable[StepSink] = ()) -> None:
        self._entries: tuple[tuple[StepSink, HookRunner | None], ...] = ()
        self._lock = threading.Lock()
        self._report = ReportOnce(_logger)
        self._closed = False
        for consumer in consumers:
            self.add(consumer)

    def add(self, consumer: StepSink) -> None:
        """Add a consumer (a user's runs on a thread of its own).

        Raises:
            TypeError: ``consumer`` is not a :class:`StepSink`.
        """
        if not isinstance(consumer, StepSink):
            raise TypeError(f"{consumer!r} is not an otel_tunix.consumers.step_accounting.StepSink")
        runner = None
        if runs_user_code(consumer):
            name = type(consumer).__name__
            runner = HookRunner(name, lambda method: self._failed(consumer, method), "steps")
        with self._lock:  # a new tuple: the worker may be iterating over the old one
            self._entries = (*self._entries, (consumer, runner))

    @property
    def sinks(self) -> tuple[StepSink, ...]:
        """The consumers, in order."""
        return tuple(consumer for consumer, _ in self._entries)

    # --- delivery (worker thread) -------------------------------------------------------
    def steps(self, steps: Sequence[FinishedStep]) -> None:
        """A batch of finished steps to every consumer's ``on_finished_steps``."""
        self._call("on_finished_steps", steps, len(steps))

    def background(self, spans: Sequence[BackgroundSpan]) -> None:
        """Background spans handed on after their step, to every ``on_background_spans``."""
        self._call("on_background_spans", spans)

    def outside(self, spans: Sequence[OutsideSpan]) -> None:
        """An outside record's spans, to every ``on_outside_spans``."""
        self._call("on_outside_spans", spans)

    def summaries(self, summaries: Sequence[StepSummary]) -> None:
        """Step summaries alone (steps read back from SDK spans), to every ``on_steps``."""
        self._call("on_steps", summaries, len(summaries))

    def flush(self) -> None:
        """Every consumer's ``flush()`` (after a batch of steps)."""
        self._call("flush")

    def _call(self, hook: str, arg: Any = None, items: int = 0) -> None:
        """``consumer.<hook>(arg)`` for every consumer, in order: queued for one on a thread
        of its own (carrying ``items`` steps), else called here."""
        if self._closed:
            return
        args = () if arg is None else (arg,)
        for consumer, runner in self._entries:
            try:
                if runner is None:
                    getattr(consumer, hook)(*args)
                else:
                    runner.call_items(items, getattr(consumer, hook), *args)
            except Exception:  # the consumer's own failure: reported once, the rest go on
                self._failed(consumer, hook)

    def _failed(self, consumer: StepSink, method: str) -> None:
        self._report(
            id(consumer),
            "otel-tunix: %s.%s failed (reported once; the run goes on)",
            type(consumer).__name__,
            method,
        )

    # --- the end ------------------------------------------------------------------------
    def runners(self) -> list[HookRunner]:
        """The hook runners of the consumers on threads of their own."""
        out = []
        for consumer, runner in self._entries:
            if runner is not None:
                out.append(runner)
            if isinstance(consumer, ProviderSpans):
                out += consumer.runners()
        return out

    def flush_hooks(self, timeout: float) -> bool:
        """Wait until the consumers on threads of their own have run every call queued so
        far (False: ``timeout`` passed first)."""
        return flush_hooks(self.runners(), timeout)

    def hooks_closing(self) -> list[tuple[str, threading.Thread]]:
        """``(name, thread)`` of each consumer being closed on a thread of its own: for a
        shutdown that waits for them beside other work."""
        out = []
        for consumer, runner in self._entries:
            if runner is not None:
                out += closing_threads((runner,), "step sink")
            if isinstance(consumer, ProviderSpans):
                out += [(f"{n} (on_end)", t) for n, t in closing_threads(consumer.runners(), "")]
        return [(name.strip(), thread) for name, thread in out]

    def finish(self, sessions: list[ScopeSession], timeout: float | None = None) -> list[str]:
        """The session totals to every consumer, then close them all. Those on threads of
        their own are closed side by side and waited for at most ``timeout`` seconds
        (default: as long as they take; ``0``: not at all, see :meth:`hooks_closing`);
        returns the names of those that had not finished."""
        self._call("on_session", sessions)
        hooks: list[tuple[HookRunner, Callable[[], object] | None]] = []
        for consumer, runner in self._entries:
            if runner is not None:
                hooks.append((runner, consumer.close))
                continue
            if isinstance(consumer, ProviderSpans):  # the processors are the provider's
                hooks += [(r, None) for r in consumer.runners()]
            try:
                consumer.close()
            except Exception:
                self._failed(consumer, "close")
        self._closed = True
        if not hooks:
            return []
        unfinished = close_hooks(hooks, 1e9 if timeout is None else timeout)
        if unfinished:
            _logger.warning(
                "otel-tunix: step sink %s had not finished after %g s; left behind",
                ", ".join(unfinished),
                timeout,
            )
        return unfinished

    @property
    def closed(self) -> bool:
        """True once :meth:`finish` ran."""
        return self._closed


def as_consumers(processors: Iterable[SpanProcessor]) -> list[StepSink]:
    """Those of ``processors`` that are consumers too (:class:`StepSpanProcessor`)."""
    return [p for p in processors if isinstance(p, StepSink)]
