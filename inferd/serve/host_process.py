"""A model host process: ``python -m inferd.serve.host_process --batch-fd FD --control-fd FD
--to-host FD:SIZE --from-host FD:SIZE --parent PID``, or the host zygote that forks them
(``--zygote --control-fd FD --parent PID``, :mod:`inferd.hosts.zygote`).

Spawned by the core (:class:`inferd.hosts.process.HostProcess`), never by hand. It holds one model
instance (:mod:`inferd.hosts.runtime`): the core's first message says which, every later one
hands it a batch or answers one of its calls. It never outlives its core, by two ties, either
enough on its own: its links (the core's ends close when the core exits or gives up on the
host, and the host then exits at once, whatever its model is doing) and ``PR_SET_PDEATHSIG``
(the kernel kills it when the core dies, even while it is stuck).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import logging
import os
import select
import signal
import socket
import sys

from inferd import event_loop
from inferd.hosts import priority
from inferd.hosts.runtime import HostRuntime
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.frames import FrameChannel, FrameReader, FrameWriter
from inferd.ipc.processes import die_with_parent
from inferd.observability import collector


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


# What the zygote imports before it forks: what every host imports (the runtime above) and what a
# Python model's instance loads (the backend, pb_utils, numpy), the event loop, and ONNX Runtime where
# it is installed: imported in each ONNX host it cost ~55 ms of CPU and ~9 MiB of private memory a host
# (many_models: hosted loads alone p50 121-130 against 173-190 ms, footprints 1,656 against 2,012 MiB for
# 40 tables); here it costs the zygote ~20 MiB once, shared with every host. torch is left to the hosts
# that use it (hundreds of MiB, and a second or more to import).
PR_SET_NAME = 15
PRELOADED = ("numpy", "triton_python_backend_utils", "inferd.backends.python", "uvloop", "onnxruntime",
             "inferd.backends.onnxruntime")


def _zygote(control_fd: int, parent: int) -> int:
    """The host zygote's loop (:mod:`inferd.hosts.zygote`): fork a host per request, reap them, say so."""
    import importlib

    for module in PRELOADED:  # everything a host runs, imported once, before any fork
        try:
            importlib.import_module(module)
        except (ImportError, OSError):  # an optional one (uvloop, onnxruntime): a host imports it itself
            pass
    collector.freeze()  # what every host shares with us stays out of its collections (and shared)
    priority.start_low()  # each host forked at the lowest priority: its start gives way, as its load does

    sock = socket.socket(fileno=control_fd)
    sock.setblocking(True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wake-up fd is written
    me = os.getpid()
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(sock)
        if sock not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 4096, 4)
        except OSError:
            return 0
        if not data:  # the core has gone
            return 0
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:  # the host
            sock.close()
            os.close(wake_r)
            os.close(wake_w)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            die_with_parent(me)
            os._exit(_host(fds, request))
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(json.dumps({"exited": pid, "status": os.waitstatus_to_exitcode(status)}).encode())


def _name_process(name: str) -> None:
    """The process's name as ps and /proc/<pid>/comm show it (15 bytes): a forked host keeps the
    zygote's command line, so its name is what tells it apart."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _host(fds: list[int], request: dict) -> int:
    """A forked host: as ``main`` would run it, on the fds the core sent."""
    _name_process(f"host:{request['label']}")
    batch, control, to_host, from_host = fds
    to_size, from_size = request["sizes"]
    _log_as(request["label"])
    try:
        return event_loop.run(serve(batch, control, f"{to_host}:{to_size}", f"{from_host}:{from_size}"),
                              request["loop"])
    except BaseException:
        logging.getLogger("inferd.host").exception("model host %s failed", request["label"])
        return 1


def _log_as(label: str) -> None:
    logging.basicConfig(level=logging.INFO, force=True,
                        format=f"%(asctime)s %(levelname)s host {label} (pid {os.getpid()}) %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.serve.host_process", description=__doc__)
    parser.add_argument("--zygote", action="store_true", help="run as the host zygote (inferd.hosts.zygote)")
    parser.add_argument("--batch-fd", type=int)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--to-host")
    parser.add_argument("--from-host")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--event-loop", choices=event_loop.KINDS, default="asyncio")
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    # The core stops its hosts itself (finalize, then a kill past the grace): a signal to the whole
    # process group (Ctrl-C, kill -- -PGID) must not end a model before the core has drained.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from inferd.observability import heap

    heap.limit_arenas()  # before any thread starts (INFERD_MALLOC_ARENA_MAX)
    if args.zygote:
        _name_process("inferd-zygote")
        _log_as("zygote")
        return _zygote(args.control_fd, args.parent)
    _log_as(args.label)
    return event_loop.run(serve(args.batch_fd, args.control_fd, args.to_host, args.from_host), args.event_loop)


if __name__ == "__main__":
    sys.exit(main())
