"""The core process's side of the hand-off (``inferd serve --frontend-workers N``).

``multiprocess``: :class:`~inferd.serve.core_process.MultiProcessServer`,
the one-process server plus its workers; ``supervisor``: reserve the ports,
spawn, watch, restart and drain the workers; ``endpoint``: each worker's
messages answered from the data plane (and the core's codec: INFER in place,
outputs into the worker's arena).
"""
