"""The hand-off between frontend worker processes and the core process.

``arena``: shared-memory tensor arenas (one allocating side each, no shared lock);
``channel``: the batched control channel over a unix socket pair; ``wire``: the
message layouts. See docs/ARCHITECTURE.md (Processes) for how they fit.
"""
