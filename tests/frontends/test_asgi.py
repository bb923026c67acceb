"""inferd.frontends.asgi: an ASGI port stops as soon as its work is done, and lets a request in flight finish."""

from __future__ import annotations

import asyncio
import http.client
from typing import Any

import pytest

from inferd.frontends.asgi import STOP_POLL_SECONDS, AsgiServer


async def _app(scope: dict, receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    if scope["path"] == "/slow":
        await _app.release.wait()  # type: ignore[attr-defined]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"answered"})


def _get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


async def test_an_idle_port_stops_without_a_tick_of_uvicorns_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn's loop sleeps 0.1 s between looks at its exit flag and once more before it looks at its
    connections: every stop of an idle port waited for them. No sleep that long is taken now."""
    server = AsgiServer(_app, "127.0.0.1", 0, "test")
    port = await server.start()
    assert await asyncio.to_thread(_get, port, "/") == (200, b"answered")  # a kept-alive connection, then closed
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(delay: float, *args: Any) -> Any:
        slept.append(delay)
        return await real_sleep(delay, *args)

    monkeypatch.setattr(asyncio, "sleep", recorded)
    await server.stop(5.0)
    assert all(delay <= STOP_POLL_SECONDS for delay in slept), slept
    assert server._task is None  # stopped: served out, not cancelled


async def test_a_request_in_flight_is_answered_before_the_port_closes() -> None:
    _app.release = asyncio.Event()  # type: ignore[attr-defined]
    server = AsgiServer(_app, "127.0.0.1", 0, "test")
    port = await server.start()
    answer = asyncio.ensure_future(asyncio.to_thread(_get, port, "/slow"))
    while not server._server or not server._server.server_state.tasks:  # the request reached the app
        await asyncio.sleep(STOP_POLL_SECONDS)
    stopping = asyncio.ensure_future(server.stop(30.0))
    await asyncio.sleep(0.05)
    assert not stopping.done()  # it waits for the request
    _app.release.set()  # type: ignore[attr-defined]
    await stopping
    assert await answer == (200, b"answered")
