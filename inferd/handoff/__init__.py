"""The hand-off between frontend worker processes and the core process.

The shared protocol: ``messages`` (one typed struct per message kind, the
whole protocol), carried by :mod:`inferd.ipc`'s ``channel`` (the batched
control channel over a unix socket pair) and ``arena`` (shared-memory tensor
arenas, one allocating side each, no shared lock). Then one package per
process side: :mod:`inferd.handoff.core` (in the process that holds the
models) and :mod:`inferd.handoff.worker` (in each frontend worker,
:mod:`inferd.serve.worker_process`). See docs/ARCHITECTURE.md (Processes)
for how they fit.
"""
