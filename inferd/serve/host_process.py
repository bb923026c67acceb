"""A model host process: ``python -m inferd.serve.host_process --batch-fd FD --control-fd FD
--to-host FD:SIZE --from-host FD:SIZE --parent PID``.

Spawned by the core (:class:`inferd.hosts.process.HostProcess`), never by hand. It holds one model
instance (:mod:`inferd.hosts.runtime`): the core's first message says which, every later one
hands it a batch or answers one of its calls. It never outlives its core, by two ties, either
enough on its own: its links (the core's ends close when the core exits or gives up on the
host, and the host then exits at once, whatever its model is doing) and ``PR_SET_PDEATHSIG``
(the kernel kills it when the core dies, even while it is stuck).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys

from inferd import event_loop
from inferd.hosts.runtime import HostRuntime
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.frames import FrameChannel, FrameReader, FrameWriter
from inferd.ipc.processes import die_with_parent


def _arena(spec: str) -> Arena:
    fd, size = spec.split(":")
    return Arena(int(fd), int(size))


async def serve(batch_fd: int, control_fd: int, to_host: str, from_host: str) -> int:
    batch = socket.socket(fileno=batch_fd)
    batch.setblocking(True)  # the model thread reads its batches here itself
    runtime = HostRuntime(_arena(to_host), ArenaWriter(_arena(from_host)), FrameReader(batch), FrameWriter(batch))
    control = await FrameChannel.open(socket.socket(fileno=control_fd), runtime.on_message, "core")
    runtime.control_link = control
    await control.closed  # type: ignore[misc]
    runtime.closed()  # the core has gone: so do we, whatever the model is doing
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.serve.host_process", description=__doc__)
    parser.add_argument("--batch-fd", type=int, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--to-host", required=True)
    parser.add_argument("--from-host", required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--event-loop", choices=event_loop.KINDS, default="asyncio")
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    # The core stops its hosts itself (finalize, then a kill past the grace): a signal to the whole
    # process group (Ctrl-C, kill -- -PGID) must not end the model before the core has drained.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from inferd.observability import heap

    heap.limit_arenas()  # before any thread starts (INFERD_MALLOC_ARENA_MAX)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s host {args.label} (pid {os.getpid()}) %(name)s: %(message)s")
    return event_loop.run(serve(args.batch_fd, args.control_fd, args.to_host, args.from_host), args.event_loop)


if __name__ == "__main__":
    sys.exit(main())
