"""Framework integrations of otel-tunix (torch, jax, transformers, tunix, system)."""
