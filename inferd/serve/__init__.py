"""Process wiring: the one place that starts processes and ties them together (the one-process server,
the core process and its supervisor, the frontend worker process, model hosts)."""
