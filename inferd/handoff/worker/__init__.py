"""The frontend worker's side of the hand-off (``python -m inferd.serve.worker_process``).

The worker process itself (start, the ties to its core, drain) is
:mod:`inferd.serve.worker_process`. ``core_link``: its link to the core (channel,
arenas, requests in flight, calls, mirrored state, the one builder of Infer
messages); ``proxy``: :class:`~inferd.handoff.worker.proxy.RemoteDataPlane`, the
façade over that link, which the one-process frontends run on unchanged;
``modelinfer``: gRPC ModelInfer straight to and from hand-off messages.
Imports the core types, the façade, the shared protocol (:mod:`inferd.handoff.messages`,
:mod:`inferd.ipc`'s ``channel`` and ``arena``) and the frontends; never the core's side
(:mod:`inferd.handoff.core`), the data plane's implementation or the model layer.
"""
