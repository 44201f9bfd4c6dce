"""The OTLP span exporters otel-tunix builds for ``OTEL_TRACES_EXPORTER=otlp``: the SDK's
own, with otel-tunix's step encoder in place of the SDK's span encoder.

Each is a subclass of the SDK's ``OTLPSpanExporter`` (gRPC or HTTP/protobuf), made by the
SDK's own constructor, so every ``OTEL_EXPORTER_OTLP_*`` setting (endpoint, protocol,
headers, compression, timeout, certificates, their ``_TRACES_`` variants, the credential
providers) and the SDK's retries, reconnection, deadlines and exporter metrics are the
SDK's. Only the bytes differ in how they are made: whole steps are encoded by
:class:`~otel_tunix.exporters.otlp_encoding.StepEncoder` (the same bytes the SDK would
send, at a tenth of the cost or less), then handed to the SDK's transport: the gRPC stub's
method with a pass-through serializer, the HTTP client's ``export(bytes)``.

Those transports are private attributes of the SDK's classes, so they are checked when the
exporter is built; if the installed SDK lacks one, the SDK's exporter is used as it is
(``OTEL_TUNIX_OTLP_FAST_PATH=false`` asks for that too).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_tunix.exporters.otlp_encoding import StepEncoder
from otel_tunix.exporters.otlp_tls import keep_certificate
from otel_tunix.pipeline.export_processor import StepSpanExporter
from otel_tunix.pipeline.span_builder import FinishedStep

__all__ = ["GrpcStepExporter", "HttpStepExporter", "otlp_span_exporter"]

_logger = logging.getLogger(__name__)
_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _Encoded:
    """A request already encoded, and how many spans it holds (what the gRPC exporter's
    ``_export`` passes to ``_translate_data`` and ``_count_data``)."""

    __slots__ = ("count", "payload")

    def __init__(self, payload: bytes, count: int) -> None:
        self.payload = payload
        self.count = count


class _BytesTraceStub:
    """The trace service stub with a pass-through request serializer: ``Export`` takes the
    request's bytes (the generated stub's serializer takes a message object)."""

    def __init__(self, channel: Any) -> None:
        self.Export = channel.unary_unary(
            _EXPORT_METHOD,
            request_serializer=None,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )


def _encode(encoder: StepEncoder, items: Sequence[ReadableSpan | FinishedStep]) -> bytes:
    for item in items:
        if isinstance(item, FinishedStep):
            item.queued_for_export(False)  # its spans are built only if the SDK encodes it
    return encoder.encode(items, FinishedStep.spans)


class GrpcStepExporter(StepSpanExporter, GrpcSpanExporter):
    """OTLP/gRPC: the SDK's exporter, sending requests that otel-tunix encoded (512 spans
    a request by default, as the SDK: a gRPC request's CPU grows with its size, so larger
    ones would save little and hold the GIL longer)."""

    def __init__(self, **kwargs: Any) -> None:
        GrpcSpanExporter.__init__(self, **kwargs)
        self._encoder = StepEncoder()
        # the SDK calls self._stub(channel) again when it reconnects
        self._stub = _BytesTraceStub
        self._client = _BytesTraceStub(self._channel)  # type: ignore[assignment]

    def export_items(
        self, items: Sequence[ReadableSpan | FinishedStep], count: int
    ) -> SpanExportResult:
        """Encode these steps and spans into one request and send it (the SDK's retries,
        deadline and reconnection)."""
        data = _Encoded(_encode(self._encoder, items), count)
        return self._export(data)  # type: ignore[arg-type]

    def _translate_data(self, data: Any) -> Any:
        if isinstance(data, _Encoded):
            return data.payload
        return encode_spans(data).SerializeToString()  # spans given to export()

    def _count_data(self, data: Any) -> int:
        return data.count if isinstance(data, _Encoded) else len(data)


class HttpStepExporter(StepSpanExporter, HttpSpanExporter):
    """OTLP/HTTP with protobuf: the SDK's exporter, posting requests that otel-tunix
    encoded: 2048 spans a request when ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` is unset, since a
    request through the SDK's HTTP transport costs ~1.3 ms of CPU whatever its size (2.5 us
    a span at 512, 0.6 at 2048; ``bench/bench_export.py``)."""

    batch_size = 2048

    def __init__(self, **kwargs: Any) -> None:
        HttpSpanExporter.__init__(self, **kwargs)
        self._encoder = StepEncoder()

    def export_items(
        self, items: Sequence[ReadableSpan | FinishedStep], count: int
    ) -> SpanExportResult:
        """Encode these steps and spans into one request and post it, as the SDK's
        ``export`` does with the request it encodes."""
        if self._shutdown:
            _logger.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE
        with self._metrics.export_operation(count) as result:
            data = _encode(self._encoder, items)
            limit = self._max_request_size
            if limit > 0 and len(data) > limit:
                _logger.warning(
                    "Dropping span batch: serialized size %d bytes exceeds max_request_size "
                    "%d bytes.",
                    len(data),
                    limit,
                )
                return SpanExportResult.FAILURE
            sent = self._client.export(data)
            if not sent.success:
                result.error = sent.error
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


_FAST: dict[type[SpanExporter], tuple[type[SpanExporter], tuple[str, ...]]] = {
    GrpcSpanExporter: (GrpcStepExporter, ("_export", "_channel", "_stub", "_client")),
    HttpSpanExporter: (
        HttpStepExporter,
        ("_client", "_metrics", "_max_request_size", "_shutdown"),
    ),
}
"""The SDK's OTLP span exporter classes, each with otel-tunix's subclass and the private
attributes of the SDK's that the subclass uses."""


def otlp_span_exporter(sdk_class: type[SpanExporter], fast: bool = True) -> SpanExporter:
    """The exporter for ``OTEL_TRACES_EXPORTER=otlp``, whose entry point gave ``sdk_class``:
    otel-tunix's subclass of it (with ``fast``, for the SDK's two OTLP classes whose private
    transport is where the subclass expects it), else ``sdk_class()``; over HTTP, keeping
    the CA certificate it was given (:func:`~otel_tunix.exporters.otlp_tls.keep_certificate`)."""
    exporter = _built(sdk_class, fast)
    keep_certificate(exporter)
    return exporter


def _built(sdk_class: type[SpanExporter], fast: bool) -> SpanExporter:
    found = _FAST.get(sdk_class) if fast else None
    if found is None:
        return sdk_class()
    cls, needs = found
    try:
        exporter = cls()
    except AttributeError as exc:  # the SDK's private layout changed
        missing = [str(exc)]
    else:
        missing = [name for name in needs if not hasattr(exporter, name)]
        if missing:
            exporter.shutdown()
    if missing:
        _logger.info(
            "otel-tunix: the installed %s has no %s; using it as it is (no OTLP fast path)",
            sdk_class.__name__,
            ", ".join(missing),
        )
        return sdk_class()
    return exporter
