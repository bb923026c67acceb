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


async def _reads_its_body(scope: dict, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):  # a body that never all arrives: waits here
        pass
    if scope["path"] == "/never":
        await asyncio.Event().wait()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"answered"})


def _post_partly(port: int, path: str, sent: bytes, length: int) -> tuple[int, bytes]:
    """Headers saying ``length`` bytes of body, and only ``sent`` of them; the answer read back."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest("POST", path)
        connection.putheader("content-length", str(length))
        connection.endheaders()
        connection.send(sent)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@pytest.mark.parametrize("path, sent, length", [
    ("/", b"0123456789", 100),  # its body had not all arrived when the grace ended
    ("/never", b"0123456789", 10),  # its app had not answered
])
async def test_a_request_still_running_when_the_grace_ends_is_answered_503_without_a_traceback(
        path: str, sent: bytes, length: int, caplog: pytest.LogCaptureFixture) -> None:
    """uvicorn answers a cancelled application 500 and logs its traceback as an application error; the
    stop's own cancel is a refusal: 503 with the reason, retryable, and one line in the log."""
    server = AsgiServer(_reads_its_body, "127.0.0.1", 0, "test")
    port = await server.start()
    answer = asyncio.ensure_future(asyncio.to_thread(_post_partly, port, path, sent, length))
    while not server._server or not server._server.server_state.tasks:  # the request reached the app
        await asyncio.sleep(STOP_POLL_SECONDS)
    await server.stop(0.05)
    status, body = await answer
    assert status == 503, body
    assert b"shutting down" in body, body
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert "answered 503" in caplog.text, caplog.text
