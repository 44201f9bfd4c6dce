"""Each private-API shortcut gives what the public way gives, in the installed versions."""

from __future__ import annotations

import asyncio
import threading

from opentelemetry import trace
from opentelemetry.context import get_current
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, get_current_span

from otel_tunix.support import shortcuts as sc


def test_threads_by_ident_is_what_current_thread_reads() -> None:
    assert sc.threads_by_ident[threading.get_ident()] is threading.current_thread()
    seen: list[bool] = []
    t = threading.Thread(
        target=lambda: seen.append(
            sc.threads_by_ident.get(threading.get_ident()) is threading.current_thread()
        )
    )
    t.start()
    t.join()
    assert seen == [True]


def test_running_loop_is_none_outside_a_loop_and_the_loop_inside_one() -> None:
    assert sc.running_loop() is None

    async def inside() -> bool:
        return sc.running_loop() is asyncio.get_running_loop()

    assert asyncio.run(inside())


def test_the_context_shortcuts_read_and_set_what_the_api_does() -> None:
    assert sc.otel_context() is get_current()
    span = NonRecordingSpan(SpanContext(1, 2, False, TraceFlags(TraceFlags.SAMPLED)))
    token = sc.attach_span(span)
    try:
        assert get_current_span() is span
        assert sc.otel_context().get(sc.SPAN_KEY) is span
    finally:
        sc.detach(token)
    assert get_current_span() is not span


def test_a_span_context_built_as_a_tuple_equals_the_constructors() -> None:
    made = sc.new_span_context(7, 9)
    assert made == SpanContext(7, 9, False, sc.SAMPLED)
    assert made.is_valid and made.trace_flags.sampled and not made.is_remote
    assert sc.SPAN_CONTEXT_AS_TUPLE


def test_processors_of_a_provider_are_found_and_removed() -> None:
    class P(SpanProcessor):
        pass

    tp = TracerProvider()
    a, b = P(), P()
    tp.add_span_processor(a)
    tp.add_span_processor(b)
    assert sc.span_processors_of(tp) == (a, b)
    assert sc.span_processors_found(tp) == (a, b)
    assert sc.span_processors_found(object()) is None  # not found: no guess
    sc.remove_span_processors(tp, (a,))
    assert sc.span_processors_of(tp) == (b,)
    assert sc.span_processors_of(a) == (a,)


def test_global_providers_can_be_set_again_after_a_reset() -> None:
    first, second = TracerProvider(), TracerProvider()
    trace.set_tracer_provider(first)
    assert trace.get_tracer_provider() is first
    sc.reset_global_providers()
    trace.set_tracer_provider(second)
    assert trace.get_tracer_provider() is second
