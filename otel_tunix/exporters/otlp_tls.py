"""The CA certificate given to an OTLP/HTTP exporter, kept when ``REQUESTS_CA_BUNDLE`` is set.

``OTEL_EXPORTER_OTLP_CERTIFICATE`` (or its ``_TRACES_`` / ``_METRICS_`` / ``_LOGS_`` variant)
names the CA an OTLP/HTTP exporter trusts. The SDK's HTTP transport (since the
``opentelemetry-exporter-http-transport`` package) puts it on its ``requests`` session as
``session.verify`` and sends without a ``verify`` argument; ``requests`` then takes
``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` from the environment over the session's value
(psf/requests#3829, #4726). Those two are set on many machines (conda, Nix, corporate
images), and there every export to a collector with a private CA failed certificate
verification, the certificate variable silently ignored. Earlier SDKs passed ``verify=``
with each request, which the environment does not override; :func:`keep_certificate` makes
the session do so again. Nothing changes where no certificate is given: the environment's
bundle then applies, as ``requests`` means it to.

Duck-typed, without importing ``requests`` or the SDK's exporters: the core imports without
the ``otlp`` extra, and an exporter laid out otherwise (gRPC, another SDK version) is left
as it is.
"""

from __future__ import annotations

from typing import Any

__all__ = ["keep_certificate"]


def _session_of(exporter: object) -> Any:
    """The ``requests`` session of an SDK OTLP/HTTP exporter (span, metric or log), else
    ``None``."""
    transport = getattr(getattr(exporter, "_client", None), "_transport", None)
    session = getattr(transport, "_session", None)
    if session is None or not callable(getattr(session, "request", None)):
        return None
    return session


def keep_certificate(exporter: object) -> bool:
    """Make the OTLP/HTTP ``exporter`` verify its collector against the CA certificate it
    was given, whatever ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` say; whether it had one
    (an exporter without, or not an OTLP/HTTP exporter, is left as it is)."""
    session = _session_of(exporter)
    if session is None or not isinstance(getattr(session, "verify", None), str):
        return False
    send = session.request
    if getattr(send, "keeps_certificate", False):
        return True

    def request(*args: Any, **kwargs: Any) -> Any:
        # An explicit verify= is the one setting requests does not replace from the
        # environment; read at each request, as the session's own value would be.
        kwargs.setdefault("verify", session.verify)
        return send(*args, **kwargs)

    request.keeps_certificate = True  # type: ignore[attr-defined]
    session.request = request
    return True
