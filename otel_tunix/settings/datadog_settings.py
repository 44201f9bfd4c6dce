"""The variables the ``datadog`` client reads itself (``DD_AGENT_HOST``, ``DD_ENV``, ...): their
rows of the settings table (:data:`otel_tunix.settings.table.SETTINGS` takes them in place,
at its end), documented there and parsed by the client."""

from __future__ import annotations

from typing import Final

from otel_tunix.settings.parsing import Setting, _text

__all__ = ["DATADOG_CLIENT_SETTINGS"]

DATADOG_CLIENT_SETTINGS: Final[tuple[Setting, ...]] = (
    Setting("DD_AGENT_HOST", "", _text, None, "DogStatsD host", "a host name", read_by="datadog"),
    Setting("DD_DOGSTATSD_PORT", "", _text, None, "DogStatsD port", "a port", read_by="datadog"),
    Setting(
        "DD_DOGSTATSD_URL",
        "",
        _text,
        None,
        "DogStatsD address (`udp://host:port`, `unix:///path`)",
        "a URL",
        read_by="datadog",
    ),
    Setting("DD_ENV", "", _text, None, "the `env` tag", "a name", read_by="datadog"),
    Setting("DD_SERVICE", "", _text, None, "the `service` tag", "a name", read_by="datadog"),
    Setting("DD_VERSION", "", _text, None, "the `version` tag", "a version", read_by="datadog"),
)
