"""Settings: every environment variable and configure() argument, read and checked once;
the attribute keys; redaction of secrets and the tally of what was refused or redacted.

The bottom layer: it imports nothing else of otel_tunix.
"""
