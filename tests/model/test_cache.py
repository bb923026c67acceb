"""The response cache (inferd.model.cache): keys, LRU by bytes, the settings, and the model path's use of it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from inferd import backends
from inferd.clock import FakeClock
from inferd.config import parse_config_text, validate
from inferd.errors import ConfigError, InvalidArgument
from inferd.model import Model, run_model
from inferd.model.cache import ResponseCache, parse_cache_config, request_key
from inferd.observability.stats import ModelStats
from inferd.scheduling.base import Scheduler, run_task
from inferd.types import InferenceRequest, RequestedOutput

CONFIG = '''
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
response_cache { enable: true }
'''


def request(values=(1.0, 2.0, 3.0, 4.0), **kw) -> InferenceRequest:  # type: ignore[no-untyped-def]
    return InferenceRequest("m", {"INPUT0": np.array([values], dtype=np.float32)}, **kw)


def key(req: InferenceRequest, model: str = "m", version: int = 1) -> bytes:
    return request_key(model, version, req)


# -- keys --------------------------------------------------------------------------------


def test_the_key_changes_with_everything_that_changes_the_result():
    base = key(request())
    assert key(request()) == base
    assert key(request((1.0, 2.0, 3.0, 5.0))) != base  # data
    assert key(request(), model="other") != base
    assert key(request(), version=2) != base
    as_f64 = InferenceRequest("m", {"INPUT0": np.array([[1, 2, 3, 4]], dtype=np.float64)})
    assert key(as_f64) != base  # datatype
    reshaped = InferenceRequest("m", {"INPUT0": np.array([1, 2, 3, 4], dtype=np.float32).reshape(2, 2)})
    assert key(reshaped) != base  # shape, same bytes
    assert key(request(parameters={"temperature": 0.5})) != base
    assert key(request(parameters={"temperature": 0.5})) != key(request(parameters={"temperature": 0.7}))
    assert key(request(requested_outputs=[RequestedOutput("OUTPUT1")])) != base


def test_scheduling_parameters_and_output_settings_stay_out_of_the_key():
    base = key(request(requested_outputs=[RequestedOutput("OUTPUT0")]))
    scheduled = request(parameters={"priority": 2, "timeout": 100, "binary_data_output": True},
                        requested_outputs=[RequestedOutput("OUTPUT0", class_count=3)])
    assert key(scheduled) == base  # classification is applied to the cached outputs per request


def test_bytes_inputs_are_keyed_by_their_elements():
    a = InferenceRequest("m", {"T": np.array([b"ab", b"c"], dtype=object)})
    b = InferenceRequest("m", {"T": np.array([b"a", b"bc"], dtype=object)})
    assert key(a) != key(b)  # the same concatenated bytes, other elements
    assert key(a) == key(InferenceRequest("m", {"T": np.array([b"ab", b"c"], dtype=object)}))


def test_a_view_and_a_copy_give_the_same_key():
    data = np.arange(16, dtype=np.float32).reshape(4, 4)
    assert key(InferenceRequest("m", {"INPUT0": data[:, ::2]})) == key(
        InferenceRequest("m", {"INPUT0": np.ascontiguousarray(data[:, ::2])}))


# -- LRU by bytes --------------------------------------------------------------------------


def outputs(n: int, fill: float = 0.0) -> dict[str, np.ndarray]:
    return {"OUTPUT0": np.full(n, fill, dtype=np.float32)}  # 4n bytes


def test_entries_are_evicted_least_recently_used_first_by_bytes():
    cache = ResponseCache(100)
    for k in (b"a", b"b", b"c"):
        assert cache.insert(k, outputs(8))  # 32 bytes each: 96 in all
    assert cache.lookup(b"a") is not None  # a is now the most recently used
    cache.insert(b"d", outputs(8))  # 128 > 100: b, the least recently used, goes
    assert cache.lookup(b"b") is None
    assert all(cache.lookup(k) is not None for k in (b"a", b"c", b"d"))
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evictions) == (3, 96, 1)
    cache.insert(b"e", outputs(20))  # 80 bytes: everything else must go
    assert cache.stats().entries == 1 and cache.lookup(b"e") is not None


def test_an_entry_larger_than_the_cache_is_not_kept_and_evicts_nothing():
    cache = ResponseCache(64)
    cache.insert(b"a", outputs(8))
    assert not cache.insert(b"big", outputs(17))  # 68 bytes
    assert cache.lookup(b"big") is None and cache.lookup(b"a") is not None


def test_entries_are_read_only_copies():
    cache = ResponseCache(1000)
    original = outputs(4, 1.0)
    cache.insert(b"a", original)
    original["OUTPUT0"][:] = 9.0  # the caller's (maybe pooled) buffer is reused
    kept = cache.lookup(b"a")
    assert kept is not None and kept["OUTPUT0"].tolist() == [1.0] * 4
    with pytest.raises(ValueError):
        kept["OUTPUT0"][0] = 2.0


def test_bytes_outputs_count_their_elements():
    cache = ResponseCache(20)
    assert cache.insert(b"a", {"T": np.array([b"abcd", b"ef"], dtype=object)})  # 6 + 2 x 4
    assert cache.stats().bytes == 14


# -- --cache-config ---------------------------------------------------------------------------


def test_cache_config_as_triton_parses_it():
    assert parse_cache_config([]) is None
    assert parse_cache_config(["local,size=1048576"]) == 1048576


@pytest.mark.parametrize("arg, words", [
    ("size=10", "No cache specified"),
    ("local,size", "format is '<cache name>,<setting>=<value>'"),
    ("redis,size=10", "only the 'local' cache"),
    ("local,bytes=10", "only the setting 'size'"),
    ("local,size=-1", "size must be a number of bytes >= 1, got '-1'"),
    ("local,size=lots", "got 'lots'"),
])
def test_bad_cache_config_is_refused_by_name(arg: str, words: str):
    with pytest.raises(InvalidArgument, match=words):
        parse_cache_config([arg])


# -- load-time checks --------------------------------------------------------------------------


def test_the_config_enables_it_and_triton_refuses_it_for_sequences_and_decoupled_models():
    assert validate(parse_config_text(CONFIG, model="m")).response_cache
    assert not validate(parse_config_text(CONFIG.replace("true", "false"), model="m")).response_cache
    sequence = CONFIG + "sequence_batching { }\n"
    with pytest.raises(ConfigError, match="Response Cache does not currently support model m with sequence batching"):
        validate(parse_config_text(sequence, model="m"))
    decoupled = CONFIG.replace('platform: "onnxruntime_onnx"', 'backend: "python"') + (
        "model_transaction_policy { decoupled: true }\n")
    with pytest.raises(ConfigError, match="with 'decoupled' transaction policy. Please disable the response cache"):
        validate(parse_config_text(decoupled, model="m"), backend=backends.get("python"))


# -- the model path ------------------------------------------------------------------------------


class Counting(Scheduler):
    """Doubles INPUT0 into both outputs; counts the requests that reach it."""

    def __init__(self) -> None:
        self.calls = 0

    def submit(self, request, rows, completion, more=False):  # type: ignore[no-untyped-def]
        return run_task(self.work(request), completion)

    async def work(self, request):  # type: ignore[no-untyped-def]
        self.calls += 1
        x = request.inputs["INPUT0"]
        return {"OUTPUT0": x * 2, "OUTPUT1": x * 3}

    def inflight(self) -> int:
        return 0

    async def stop(self) -> None:
        pass


def cached_model(cache: ResponseCache | None) -> Model:
    spec = validate(parse_config_text(CONFIG, model="m"))
    return Model(spec=spec, version=1, scheduler=Counting(), stats=ModelStats("m", 1), model_dir=None,  # type: ignore[arg-type]
                 cache=cache)


def test_a_hit_skips_the_model_and_is_counted_as_triton_counts_it():
    model = cached_model(ResponseCache(1 << 20))
    clock = FakeClock()
    first = asyncio.run(run_model(model, request(), clock))
    second = asyncio.run(run_model(model, request(), clock))
    assert model.scheduler.calls == 1  # type: ignore[attr-defined]
    assert second["OUTPUT0"].tolist() == first["OUTPUT0"].tolist() == [[2.0, 4.0, 6.0, 8.0]]
    s = model.stats.snapshot()
    assert (s.cache_hit.count, s.cache_miss.count, s.success.count) == (1, 1, 2)
    assert s.cache_hit.ns > 0 and s.cache_miss.ns > 0


def test_a_hit_is_shaped_for_its_own_request():
    model = cached_model(ResponseCache(1 << 20))
    clock = FakeClock()
    asyncio.run(run_model(model, request(), clock))
    top = asyncio.run(run_model(model, request(requested_outputs=[RequestedOutput("OUTPUT0", class_count=2)]), clock))
    assert model.scheduler.calls == 2  # type: ignore[attr-defined]  # other outputs asked for: another key
    again = asyncio.run(run_model(model, request(requested_outputs=[RequestedOutput("OUTPUT0", class_count=1)]), clock))
    assert model.scheduler.calls == 2  # type: ignore[attr-defined]
    assert list(top) == ["OUTPUT0"] and top["OUTPUT0"].tolist() == [[b"8.000000:3", b"6.000000:2"]]
    assert again["OUTPUT0"].tolist() == [[b"8.000000:3"]]


def test_a_model_without_the_cache_executes_every_request():
    model = cached_model(None)
    for _ in range(2):
        asyncio.run(run_model(model, request(), FakeClock()))
    assert model.scheduler.calls == 2  # type: ignore[attr-defined]
    assert model.stats.snapshot().cache_miss.count == 0


def test_failures_are_not_cached():
    model = cached_model(ResponseCache(1 << 20))

    class Failing(Counting):
        async def work(self, request):  # type: ignore[no-untyped-def]
            self.calls += 1
            raise InvalidArgument("no")

    model = replace(model, scheduler=Failing())
    for _ in range(2):
        with pytest.raises(InvalidArgument):
            asyncio.run(run_model(model, request(), FakeClock()))
    assert model.scheduler.calls == 2  # type: ignore[attr-defined]
    assert model.stats.snapshot().cache_hit.count == 0
