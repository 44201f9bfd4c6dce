"""Zero-code start: otel-tunix's OpenTelemetry distro and configurator.

``opentelemetry-instrument python train.py`` loads, in order, the ``opentelemetry_distro``
entry point (:class:`OtelTunixDistro`), the ``opentelemetry_configurator`` entry point
(:class:`OtelTunixConfigurator`) and every ``opentelemetry_instrumentor`` entry point
(``otel_tunix_torch``, ``otel_tunix_transformers``, ...; each can be switched off with
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``).

The configurator does not build providers at interpreter start. It arms
:func:`otel_tunix.instrumentation._base.ensure_configured`, and the integrations call
:func:`otel_tunix.configure` (which reads the usual ``OTEL_*`` and ``OTEL_TUNIX_*`` variables)
when a training loop starts. Helper processes that inherit the auto-instrumentation
(DataLoader workers, ``torch.compile`` workers, tokenizer children) never train, so they write
no run folder and cannot overwrite the trainer's summary. A program that calls
``otel_tunix.configure()`` itself keeps its own settings. Needs the ``instrument`` extra
(``opentelemetry-instrumentation``).
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro
from opentelemetry.instrumentation.environment_variables import OTEL_PYTHON_CONFIGURATOR
from opentelemetry.sdk._configuration import _BaseConfigurator

from otel_tunix.instrumentation import _base

__all__ = ["CONFIGURATOR_NAME", "OtelTunixConfigurator", "OtelTunixDistro"]

CONFIGURATOR_NAME = "otel_tunix"
"""Name of otel-tunix's ``opentelemetry_configurator`` (and ``opentelemetry_distro``) entry
point: ``OTEL_PYTHON_DISTRO=otel_tunix`` / ``OTEL_PYTHON_CONFIGURATOR=otel_tunix`` pick them
when several are installed."""


class OtelTunixDistro(BaseDistro):  # type: ignore[misc]
    """Selects otel-tunix's configurator unless ``OTEL_PYTHON_CONFIGURATOR`` names another."""

    def _configure(self, **kwargs: Any) -> None:
        os.environ.setdefault(OTEL_PYTHON_CONFIGURATOR, CONFIGURATOR_NAME)


class OtelTunixConfigurator(_BaseConfigurator):
    """Arms otel-tunix's lazy ``configure()`` for the integrations (see the module doc)."""

    def _configure(self, **kwargs: Any) -> None:
        _base.enable_auto_configure()
