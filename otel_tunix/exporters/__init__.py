"""Exporters of otel-tunix: perfetto, jsonl, datadog (DogStatsD), prometheus."""
