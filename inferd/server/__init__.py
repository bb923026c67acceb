"""Frontends (gRPC, HTTP) and the protocol-neutral data plane they share."""
