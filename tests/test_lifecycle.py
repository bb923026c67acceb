"""Issue #2: graceful stop. SIGTERM while a request is in flight lets it finish, new
requests are refused meanwhile, and the server exits 0.

The request in flight is held by a gated Python model (tests/gated_model.py): it is
executing when the signal is sent (the gate's started file) and ends when the test
releases it, so nothing depends on how long a request takes on this machine.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gated_model import add_gated_model, release, wait_started


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "lifecycle"
    add_gated_model(repo, "held", tmp_path / "gate")
    return repo


def _inputs(value: float) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("INPUT0", [3], "FP32")
    x.set_data_from_numpy(np.full(3, value, dtype=np.float32))
    return [x]


class _InFlight(threading.Thread):
    def __init__(self, url: str, value: float) -> None:
        super().__init__(daemon=True)
        self.url, self.value = url, value
        self.result = None
        self.error: BaseException | None = None

    def run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        try:
            self.result = client.infer("held", _inputs(self.value), client_timeout=120)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            client.close()


def _wait_refused(client, timeout: float = 30) -> None:
    """Until the server stops answering as ready (the stop began)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not client.is_server_ready():
                return
        except InferenceServerException:
            return
        time.sleep(0.01)
    raise AssertionError("the server kept answering ready after SIGTERM")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_lets_in_flight_request_finish(start_server, repo, tmp_path, sig):
    server = start_server(repo, log_path=tmp_path / "server.log")
    gate = tmp_path / "gate"
    request = _InFlight(server.url, 5.0)
    request.start()
    try:
        wait_started(gate)  # it reached the model, and stays there until released
        server.proc.send_signal(sig)
        client = grpcclient.InferenceServerClient(server.url)
        _wait_refused(client)
        client.close()
        # The stop has begun: new requests are refused...
        late = grpcclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException) as exc:
            late.infer("held", _inputs(1.0), client_timeout=10)
        assert exc.value.status() == "StatusCode.UNAVAILABLE"
        late.close()
        assert request.is_alive()  # the one in flight is still unanswered: the signal came first
    finally:
        release(gate)
    # ...while the one in flight finishes, with the right answer.
    request.join(60)
    assert request.error is None, f"{request.error}\n{server.log()}"
    np.testing.assert_array_equal(request.result.as_numpy("OUTPUT0"), np.full(3, 5.0, dtype=np.float32))

    assert server.proc.wait(60) == 0, server.log()
    log = server.log()
    assert "stopping: finishing in-flight requests" in log and "stopped" in log
    assert "Traceback" not in log


def test_idle_server_exits_zero(start_server, repo, tmp_path):
    server = start_server(repo, log_path=tmp_path / "server.log")
    client = grpcclient.InferenceServerClient(server.url)
    assert client.is_server_ready()
    client.close()
    assert server.stop(signal.SIGTERM) == 0, server.log()


def test_grace_period_bounds_the_wait(start_server, repo, tmp_path):
    """A request longer than --exit-timeout-secs is cut off; the server still exits 0."""
    server = start_server(repo, ["--exit-timeout-secs", "0.2"], log_path=tmp_path / "server.log")
    gate = tmp_path / "gate"
    request = _InFlight(server.url, 1.0)
    request.start()
    try:
        wait_started(gate)
        server.proc.send_signal(signal.SIGTERM)
        request.join(60)  # answered while the gate still holds the execution: cut off by the grace
        assert not request.is_alive()
    finally:
        release(gate)  # the execution's thread may end now (the process does not wait for it)
    assert isinstance(request.error, InferenceServerException), request.result
    assert request.error.status() in ("StatusCode.UNAVAILABLE", "StatusCode.CANCELLED")
    assert server.proc.wait(60) == 0, server.log()
    assert "still unanswered after the" in server.log()
