"""A span's error: the status and ``exception`` event of a span whose block raised (steps,
background and outside components alike; the text is
:func:`otel_tunix.model.record.exception_text`, as the spans JSONL's ``error``)."""

from __future__ import annotations

import traceback

from opentelemetry.sdk.trace import Event
from opentelemetry.trace import Status, StatusCode

from otel_tunix.model.record import exception_message, exception_text
from otel_tunix.support.text import clean_value

__all__ = ["span_error"]

_UNSET = Status(StatusCode.UNSET)
_MAX_STACKTRACE = 32768


def span_error(exc: BaseException | None, end_ns: int) -> tuple[Status, tuple[Event, ...]]:
    """The status and events of a span that ended at ``end_ns`` with ``exc`` escaping (an
    unset status and no event without one), as the SDK's ``record_exception`` makes them."""
    if exc is None:
        return _UNSET, ()
    event = Event(
        "exception",
        {
            "exception.type": type(exc).__qualname__,
            "exception.message": clean_value(exception_message(exc)),
            "exception.stacktrace": clean_value(
                "".join(traceback.format_exception(exc)), _MAX_STACKTRACE
            ),
            "exception.escaped": True,
        },
        timestamp=end_ns,
    )
    return Status(StatusCode.ERROR, exception_text(exc)), (event,)
