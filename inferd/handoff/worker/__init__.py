"""The frontend worker's side of the hand-off (``python -m inferd.serve.worker_process``).

``process``: the worker process (start, the ties to its core, drain); ``core_link``:
its link to the core (channel, arenas, requests in flight, calls, mirrored
state); ``proxy``: :class:`~inferd.handoff.worker.proxy.RemoteDataPlane`, the
façade over that link, which the one-process frontends run on unchanged;
``grpc_codec``: gRPC ModelInfer straight to and from hand-off messages.
Imports the core types, the façade, the wire protocol (:mod:`inferd.handoff`'s
``wire``, ``channel``, ``arena``) and the frontends; never the core's side
(:mod:`inferd.handoff.core`), the data plane's implementation or the model layer.
"""
