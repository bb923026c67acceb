"""The hand-off between frontend worker processes and the core process.

The shared protocol: ``wire`` (the message layouts), ``channel`` (the batched
control channel over a unix socket pair), ``arena`` (shared-memory tensor
arenas, one allocating side each, no shared lock). Then one package per
process side: :mod:`inferd.handoff.core` (in the process that holds the
models) and :mod:`inferd.serve.worker_process` (in each frontend worker). See
docs/ARCHITECTURE.md (Processes) for how they fit.
"""
