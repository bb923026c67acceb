"""Transport between inferd's processes: the control channel (msgpack over a unix socket pair, one write per
loop turn) and shared-memory arenas (memfd, one allocating side each). The hand-off to frontend workers and
the model hosts both speak over them."""
