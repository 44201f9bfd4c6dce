"""Exporters of otel-tunix: perfetto, jsonl, datadog (DogStatsD), prometheus, otlp (the SDK's
OTLP span exporters with otel-tunix's step encoder)."""
