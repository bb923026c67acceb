"""The frontends: gRPC, HTTP/REST and the OpenAI-compatible /v1, each translating the wire to and from the
data plane's façade (:mod:`inferd.facade`), and what they share (status table, TLS, restricted groups)."""
