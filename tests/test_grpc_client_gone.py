"""An answer or an abort is never written to a gRPC call that is already over for its client.

grpc.aio leaks a failed batch's ops and the message they hold (grpc/grpc#43360): a response or an
abort sent after the client cancelled, or after the deadline it sent passed, cost a frontend 86 bytes
per cancel and about 2 KB per passed deadline, which was the soak's RSS slope (issue 24). ModelInfer
ends such a call with CancelledError instead, which makes grpc.aio send nothing (gRPC itself has
already told the client CANCELLED or DEADLINE_EXCEEDED). These drive the servicer with a stand-in
context, whose state the test sets, so that each ordering is forced rather than raced.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from inferd.errors import DeadlineExceeded
from inferd.frontends.grpc_service import InferenceServicer
from inferd.types import InferenceResponse


class Context:
    def __init__(self, remaining: float | None = None, cancelled: bool = False) -> None:
        self.remaining, self._cancelled = remaining, cancelled
        self.aborts: list[tuple] = []

    def time_remaining(self) -> float | None:
        return self.remaining

    def cancelled(self) -> bool:
        return self._cancelled

    def invocation_metadata(self) -> tuple:
        return ()

    async def abort(self, code, details, trailing_metadata=()):  # type: ignore[no-untyped-def]  # grpc.aio's signature
        self.aborts.append((code, details))
        raise RuntimeError("aborted")  # what grpc.aio's AbortError does: the handler ends


class DataPlane:
    """Answers once the test lets it, after moving the context to the state the test wants."""

    def __init__(self, context: Context, error: Exception | None = None, *, remaining: float | None = None,
                 cancel: bool = False) -> None:
        self.context, self.error, self.remaining, self.cancel = context, error, remaining, cancel

    def tracing_on(self) -> bool:
        return False

    async def infer(self, request, trace_carrier=None):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        self.context.remaining = self.remaining
        self.context._cancelled = self.cancel
        if self.error is not None:
            raise self.error
        return InferenceResponse(model_name=request.model_name, model_version="1",
                                 outputs={"OUTPUT0": np.ones((1, 4), np.float32)})


def request() -> pb.ModelInferRequest:
    m = pb.ModelInferRequest(model_name="identity_fp32")
    t = m.inputs.add(name="INPUT0", datatype="FP32")
    t.shape.extend([1, 4])
    m.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    return m


def run(context: Context, dataplane: DataPlane):  # type: ignore[no-untyped-def]
    return asyncio.run(InferenceServicer(dataplane).ModelInfer(request(), context))


def test_an_answer_to_a_live_call_is_returned() -> None:
    ctx = Context(remaining=5.0)
    answer = run(ctx, DataPlane(ctx, remaining=4.9))
    assert answer.model_name == "identity_fp32" and answer.outputs[0].name == "OUTPUT0"


def test_an_error_to_a_live_call_is_sent_as_its_status() -> None:
    ctx = Context(remaining=5.0)
    with pytest.raises(RuntimeError, match="aborted"):
        run(ctx, DataPlane(ctx, DeadlineExceeded("model 'identity_fp32': the deadline passed"), remaining=0.5))
    assert len(ctx.aborts) == 1 and "deadline passed" in ctx.aborts[0][1]


@pytest.mark.parametrize("error", [None, DeadlineExceeded("model 'identity_fp32': the request's deadline passed")])
def test_nothing_is_written_once_the_clients_deadline_passed(error: Exception | None) -> None:
    ctx = Context(remaining=0.01)
    with pytest.raises(asyncio.CancelledError):
        run(ctx, DataPlane(ctx, error, remaining=-0.001))
    assert ctx.aborts == []


@pytest.mark.parametrize("error", [None, DeadlineExceeded("model 'identity_fp32': cancelled")])
def test_nothing_is_written_to_a_call_the_client_cancelled(error: Exception | None) -> None:
    ctx = Context()
    with pytest.raises(asyncio.CancelledError):
        run(ctx, DataPlane(ctx, error, cancel=True))
    assert ctx.aborts == []
