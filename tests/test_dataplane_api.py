"""The data plane façade (issue #12): every method a frontend calls is async and
answers in plain, picklable data, so a frontend in another process can hold a
proxy with the same interface; the data plane refuses new work while it drains."""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest

from inferd.dataplane import DataPlane
from inferd.facade import DataPlaneAPI
from inferd.errors import NotFound, Unavailable
from inferd.examples import onnx_models as om
from inferd.repository import ModelManager
from inferd.types import InferenceRequest
from repo_builder import add_model, config

IO = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
OUT = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]


def _facade_methods() -> list[str]:
    return [n for n, v in vars(DataPlaneAPI).items() if inspect.isfunction(v) and not n.startswith("_")]


def test_dataplane_implements_the_facade_with_async_methods():
    names = _facade_methods()
    assert {"infer", "infer_stream", "model_statistics", "shm_register", "trace_settings"} <= set(names)
    for name in names:
        impl, declared = getattr(DataPlane, name), getattr(DataPlaneAPI, name)
        assert list(inspect.signature(impl).parameters) == list(inspect.signature(declared).parameters), name
        if name == "infer_stream":
            assert inspect.isasyncgenfunction(impl)
        elif name in LOCAL_READS:
            assert not inspect.iscoroutinefunction(declared) and not inspect.iscoroutinefunction(impl), name
        else:
            assert inspect.iscoroutinefunction(impl), name


# What the façade lets a frontend ask synchronously, on every request: answered from the process's own
# state (a frontend worker's copy), never a round trip to the core.
LOCAL_READS = {"tracing_on"}


@pytest.fixture
async def plane(tmp_path):
    add_model(tmp_path, "simple", om.add_sub(np.int32, 16, batch=True), config("simple", IO, OUT, 8))
    manager = ModelManager([tmp_path])
    dp = DataPlane(manager)
    await dp.load_models()
    yield dp
    await dp.close()


def _request() -> InferenceRequest:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return InferenceRequest("simple", {"INPUT0": a, "INPUT1": a}, id="r1")


def _round_trip(value):  # type: ignore[no-untyped-def]
    return pickle.loads(pickle.dumps(value))


async def test_answers_are_plain_picklable_data(plane):
    dp = plane
    response = await dp.infer(_request())
    back = _round_trip(response)
    assert (back.model_name, back.model_version, back.id) == ("simple", 1, "r1")
    np.testing.assert_array_equal(back.outputs["OUTPUT0"], response.outputs["OUTPUT0"])
    answers = [
        await dp.server_live(), await dp.server_ready(), await dp.model_ready("simple"),
        await dp.server_metadata(), await dp.model_metadata("simple"), await dp.model_statistics(),
        await dp.repository_index(), await dp.shm_status(), await dp.trace_settings(), await dp.log_settings(),
    ]
    for answer in answers:
        assert _round_trip(answer) == answer
    config_msg = await dp.model_config("simple")  # opaque, as config/ made it; a protobuf message pickles
    assert _round_trip(config_msg) == config_msg and config_msg.name == "simple"
    with pytest.raises(NotFound) as info:
        await dp.model_statistics("nope")
    assert _round_trip(info.value).message == info.value.message


async def test_statistics_are_a_snapshot(plane):
    dp = plane
    await dp.infer(_request())
    (before,) = await dp.model_statistics("simple")
    await dp.infer(_request())
    (after,) = await dp.model_statistics("simple")
    assert (before.inference_count, before.success.count) == (1, 1)  # the copy did not move
    assert (after.inference_count, after.success.count) == (2, 2)
    assert [b.batch_size for b in after.batch_stats] == [1]


async def test_a_draining_data_plane_refuses_new_inference(plane):
    dp = plane
    dp.drain()
    assert not await dp.server_ready() and not await dp.model_ready("simple")
    with pytest.raises(Unavailable, match="shutting down"):
        await dp.infer(_request())
    items = [item async for item in dp.infer_stream(_request())]
    assert len(items) == 1 and items[0].final and isinstance(items[0].error, Unavailable)
    (stats,) = await dp.model_statistics("simple")
    assert stats.success.count == 0 and stats.fail.count == 0  # refused before the model path
