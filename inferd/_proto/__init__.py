"""Generated protobuf/gRPC code for the KServe v2 / Triton protocol.

The modules here are produced from ``proto/*.proto`` by
``python -m inferd._proto.generate``; do not edit them by hand. Their
descriptors live in the private pool of :mod:`inferd._proto._pool`, not in
protobuf's default pool, so they can share a process with tritonclient.
"""
