"""Generated protobuf/gRPC code for the KServe v2 / Triton protocol.

Produced from the repository's ``proto/*.proto`` by ``python -m inferd._proto.generate``
(run from the inferd checkout); do not edit by hand. The descriptors live in the
private pool of ``_pool.py``, so this package can share a process with tritonclient,
which registers the same ``inference.*`` names in protobuf's default pool.
"""
