"""Statistics, metrics and tracing."""
