"""A request whose client's deadline passed before the data plane saw it (waiting in the transport, the
hand-off, a frontend's loop) is refused DEADLINE_EXCEEDED at admission, before it holds anything or
reaches a model's queue (issue 42); one with time left is served. Deadlines are absolute times on the
real monotonic clock, which the data plane reads."""

from __future__ import annotations

import time

import numpy as np
import pytest

from inferd.dataplane import DataPlane
from inferd.errors import DeadlineExceeded
from inferd.examples import onnx_models as om
from inferd.repository import ModelManager
from inferd.types import InferenceRequest
from repo_builder import add_model, config

IO = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
OUT = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]


@pytest.fixture
async def plane(tmp_path):
    add_model(tmp_path, "simple", om.add_sub(np.int32, 16, batch=True), config("simple", IO, OUT, 8))
    dp = DataPlane(ModelManager([tmp_path]))
    await dp.load_models()
    yield dp
    await dp.close()


def _request(deadline: float | None) -> InferenceRequest:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return InferenceRequest("simple", {"INPUT0": a, "INPUT1": a}, deadline=deadline)


async def test_a_request_whose_deadline_passed_before_admission_is_refused_and_never_queued(plane):
    dp = plane
    with pytest.raises(DeadlineExceeded) as info:
        await dp.infer(_request(time.monotonic() - 0.25))
    message = info.value.message
    assert message.startswith("model 'simple': the request's deadline passed ") and \
        message.endswith(" us before inferd admitted it; it was not run")
    assert int(message.split("passed ")[1].split(" us")[0]) >= 250_000
    assert dp.inflight() == 0 and dp.admission.refused == 0  # not an overload refusal
    with pytest.raises(DeadlineExceeded, match="before inferd admitted it"):
        dp.submit(_request(time.monotonic() - 0.25), lambda run: None)  # the callback path alike
    served = await dp.infer(_request(time.monotonic() + 30))
    assert (served.outputs["OUTPUT0"] == 2 * np.arange(16, dtype=np.int32)).all()
