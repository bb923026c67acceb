"""A stand-in frontend worker for the supervisor's tests: the real one's lifecycle, no servicers.

On CONFIG it listens on ``config["port"]`` (SO_REUSEPORT, as a real worker does) and says HELLO;
each accepted connection is answered with its pid and closed; DRAIN (or RECYCLE) closes the port and exits 0;
the channel closing exits at once. ``config["behaviour"]`` makes it misbehave: ``exit`` (exit 3
before HELLO), ``silent`` (never HELLO), ``deaf`` (ignore DRAIN), ``stuck`` (block its loop after HELLO, so
that only PR_SET_PDEATHSIG can end it when the core dies).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time

from inferd.handoff.messages import Config, Drain, Hello, Recycle, ToWorker
from inferd.ipc.channel import Channel
from inferd.ipc.processes import die_with_parent
from inferd.serve.worker_process import listen


async def main(index: int, fd: int) -> int:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    server: list[asyncio.base_events.Server] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"{os.getpid()}\n".encode())
        await writer.drain()
        writer.close()

    async def configure(config: dict) -> None:
        behaviour = config.get("behaviour", "")
        if behaviour == "exit":
            done.set_result(3)
            return
        sock = listen("127.0.0.1", config["port"], "test")
        server.append(await asyncio.start_server(answer, sock=sock))
        if behaviour != "silent":
            channel.send(Hello(index, os.getpid()))
        if behaviour == "deaf":
            server.append(None)  # type: ignore[arg-type]
        if behaviour == "stuck":
            channel.flush_now()
            time.sleep(600)

    def on_message(msg: ToWorker) -> None:
        if type(msg) is Config:
            loop.create_task(configure(msg.options))
        elif type(msg) in (Drain, Recycle) and len(server) == 1 and not done.done():
            server[0].close()
            done.set_result(0)

    channel = await Channel.open(socket.socket(fileno=fd), on_message, "worker", receives=ToWorker)
    channel.closed.add_done_callback(lambda _: done.done() or done.set_result(0))  # type: ignore[union-attr]
    code = await done
    channel.close()
    return code


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=int)
    parser.add_argument("--channel-fd", type=int)
    parser.add_argument("--parent", type=int)
    args = parser.parse_args()
    die_with_parent(args.parent)
    raise SystemExit(asyncio.run(main(args.index, args.channel_fd)))
