"""The rest of Triton's Python backend API on models written here, through a real server:
BLS into a decoupled model (``exec(decoupled=True)`` iterated, ``async_exec(decoupled=True)``
with ``async for``, ``cancel()`` on the iterator), custom metrics (counter, gauge, histogram
on ``/metrics`` with the model's labels, and their errors), ``get_model_dir``, a model name
given as bytes. One server for the module; each test one or two requests."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import running
from repo_builder import add_python_model

pytestmark = pytest.mark.server

# Sends IN responses, OUT = 0..IN-1, then the final flag alone; a request it finds cancelled
# before it is done answers CANCELLED (the caller cancels after reading two).
COUNTER = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily("api_counter_cancelled", "Requests the counter found cancelled",
                                            pb_utils.MetricFamily.COUNTER)
        self.lock = threading.Lock()
        self.by_n = {}

    def cancelled(self, n):
        # Counted per IN value: a test reads only the cancels of its own calls, whenever another test's
        # cancel (noticed by its thread on its own time) is counted.
        with self.lock:
            if n not in self.by_n:
                self.by_n[n] = self.family.Metric(labels={"model": "counter", "n": str(n)})
            return self.by_n[n]

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request,)).start()

    def run(self, request):
        n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
        sender = request.get_response_sender()
        for i in range(n):
            if request.is_cancelled() or sender.is_cancelled():
                self.cancelled(n).increment(1)
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("stopped", pb_utils.TritonError.CANCELLED)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            if n > 100 and i == 1:
                self.wait_cancel(request)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def wait_cancel(self, request):
        # A long request: it waits (bounded, 60 s) for the caller's cancel before its next response,
        # so a cancellation seen within the test's 30 s came from the caller, not from a stall.
        import time
        for _ in range(12000):
            if request.is_cancelled():
                return
            time.sleep(0.005)
'''

# mode 0: exec(decoupled=True) summed; 1: async_exec + async for; 2: read two, cancel, read the rest.
CALLER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


def call(n):
    return pb_utils.InferenceRequest(model_name=b"counter", requested_output_names=["OUT"],
                                     inputs=[pb_utils.Tensor("IN", np.array([n], np.int32))])


def report(responses):
    seen = []
    for r in responses:
        if r.has_error():
            seen.append({"error": r.error().message(), "code": r.error().code()})
        elif r.output_tensors():
            seen.append(int(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy()[0]))
        else:
            seen.append("final")
    return seen


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for request in requests:
            mode, n = (int(v) for v in pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
            if mode == 0:
                seen = report(call(n).exec(decoupled=True))
            elif mode == 1:
                it = await call(n).async_exec(decoupled=True)
                seen = report([r async for r in it])
            elif mode == 3:  # BLS into a sequence model: START, then END, correlation id 77
                seen = []
                for flags in (pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
                              pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END):
                    r = pb_utils.InferenceRequest(model_name="stateful", correlation_id=77, flags=0,
                                                  requested_output_names=["OUT"],
                                                  inputs=[pb_utils.Tensor("IN", np.array([[n]], np.int32))])
                    r.set_flags(flags)
                    response = r.exec()
                    if response.has_error():
                        seen.append(response.error().message())
                    else:
                        seen.append(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy().reshape(-1).tolist())
            elif mode == 4:  # read two, then drop the iterator unread: the call is cancelled
                it = call(n).exec(decoupled=True)
                seen = report([next(it), next(it)])
                del it
                import gc
                gc.collect()
            else:
                it = call(n).exec(decoupled=True)
                first = [next(it), next(it)]
                it.cancel()
                seen = report(first + list(it))
            text = json.dumps({"seen": seen, "dir": pb_utils.get_model_dir()})
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))]))
        return out
'''

# Answers each request with its own correlation id and flags (a sequence model).
STATEFUL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([int(r.correlation_id()), r.flags()],
                                                                              np.int64))]) for r in requests]
'''

METRICS = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.count = pb_utils.MetricFamily("api_requests", "Requests seen", pb_utils.MetricFamily.COUNTER)
        self.level = pb_utils.MetricFamily("api_level", "Last value", pb_utils.MetricFamily.GAUGE)
        self.sizes = pb_utils.MetricFamily("api_value", "Values seen", pb_utils.MetricFamily.HISTOGRAM)
        labels = {"version": "1", "model": args["model_name"]}
        self.c = self.count.Metric(labels=labels)
        self.g = self.level.Metric(labels=labels)
        self.h = self.sizes.Metric(labels=labels, buckets=[1.0, 10.0])
        self.errors = []
        for attempt in (
            lambda: self.c.increment(-1),
            lambda: self.c.set(3),
            lambda: self.h.increment(1),
            lambda: self.g.observe(1),
            lambda: self.sizes.Metric(labels=labels),
            lambda: self.count.Metric(labels=labels, buckets=[1.0]),
            lambda: pb_utils.MetricFamily("api_requests", "again", pb_utils.MetricFamily.GAUGE),
            lambda: pb_utils.MetricFamily("nv_inference_mine", "reserved", pb_utils.MetricFamily.GAUGE),
        ):
            try:
                attempt()
                self.errors.append(None)
            except pb_utils.TritonModelException as exc:
                self.errors.append(str(exc))

    def execute(self, requests):
        out = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.c.increment(1)
            self.g.set(x)
            self.h.observe(x)
            text = json.dumps({"count": self.c.value(), "errors": self.errors})
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))]))
        return out
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("python_api")
    add_python_model(repo, "counter", COUNTER, '''
        backend: "python"
        model_transaction_policy { decoupled: true }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    ''')
    add_python_model(repo, "caller", CALLER, '''
        backend: "python"
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
    ''')
    add_python_model(repo, "stateful", STATEFUL, '''
        backend: "python"
        max_batch_size: 4
        sequence_batching { }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 2 ] } ]
    ''')
    add_python_model(repo, "metrics", METRICS, '''
        backend: "python"
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
    ''')
    with running(repo) as s:
        s.repo = repo
        yield s


def _ask(server, model: str, value: np.ndarray) -> dict:
    with httpclient.InferenceServerClient(server.http_url) as client:
        inp = httpclient.InferInput("IN", list(value.shape), "INT32" if value.dtype == np.int32 else "FP32")
        inp.set_data_from_numpy(value)
        result = client.infer(model, [inp])
    return json.loads(result.as_numpy("OUT")[0])


def test_exec_decoupled_iterates_every_response_then_the_empty_final(server):
    answer = _ask(server, "caller", np.array([0, 3], np.int32))
    assert answer["seen"] == [0, 1, 2, "final"]


def test_exec_decoupled_with_no_response_yields_only_the_final(server):
    assert _ask(server, "caller", np.array([0, 0], np.int32))["seen"] == ["final"]


def test_async_exec_decoupled_is_an_async_iterator(server):
    assert _ask(server, "caller", np.array([1, 4], np.int32))["seen"] == [0, 1, 2, 3, "final"]


def test_cancel_on_the_iterator_reaches_the_callee(server):
    seen = _ask(server, "caller", np.array([2, 1000], np.int32))["seen"]
    assert seen[:2] == [0, 1]
    assert len(seen) < 1000
    last = seen[-1]
    assert isinstance(last, dict) and last["code"] == 7, seen  # TritonError.CANCELLED


def test_bls_into_a_sequence_model_carries_correlation_id_and_flags(server):
    seen = _ask(server, "caller", np.array([3, 1], np.int32))["seen"]
    assert seen == [[77, 1], [77, 2]], seen  # START, then END, of sequence 77


def _cancelled_count(server, n: int) -> int:
    """Calls of the counter with IN = ``n`` that it found cancelled."""
    found = re.search(rf'^api_counter_cancelled\{{model="counter",n="{n}"\}} (\d+)', _metrics(server), re.M)
    return int(found.group(1)) if found else 0


def test_an_iterator_dropped_unread_cancels_its_call(server):
    n = 1001  # no other test calls the counter with it: only this test's cancel is counted under it
    assert _cancelled_count(server, n) == 0
    assert _ask(server, "caller", np.array([4, n], np.int32))["seen"] == [0, 1]
    deadline = time.monotonic() + 30  # bounded: the callee notices within its 5 ms checks
    while _cancelled_count(server, n) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _cancelled_count(server, n) == 1


def test_get_model_dir_is_the_version_folder(server):
    answer = _ask(server, "caller", np.array([0, 1], np.int32))
    assert Path(answer["dir"]) == server.repo / "caller" / "1"


def _metrics(server) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        return r.read().decode()


def test_custom_metrics_are_served_with_the_models_labels(server):
    _ask(server, "metrics", np.array([5.0], np.float32))
    answer = _ask(server, "metrics", np.array([0.5], np.float32))
    assert answer["count"] == 2
    text = _metrics(server)
    assert "# HELP api_requests Requests seen\n# TYPE api_requests counter\n" in text
    assert 'api_requests{model="metrics",version="1"} 2\n' in text
    assert "# TYPE api_level gauge\n" in text and 'api_level{model="metrics",version="1"} 0.5\n' in text
    assert "# TYPE api_value histogram\n" in text
    assert 'api_value_bucket{model="metrics",version="1",le="1"} 1\n' in text
    assert 'api_value_bucket{model="metrics",version="1",le="10"} 2\n' in text
    assert 'api_value_bucket{model="metrics",version="1",le="+Inf"} 2\n' in text
    assert 'api_value_sum{model="metrics",version="1"} 5.5\n' in text
    assert 'api_value_count{model="metrics",version="1"} 2\n' in text


def test_custom_metrics_refuse_what_their_kind_does_not_do(server):
    errors = _ask(server, "metrics", np.array([1.0], np.float32))["errors"]
    assert all(errors), errors  # every attempt raised
    negative, set_counter, inc_hist, observe_gauge, no_buckets, buckets_on_counter, other_kind, reserved = errors
    assert "counter only goes up, got -1" in negative
    assert "only a gauge is set" in set_counter
    assert "use observe" in inc_hist
    assert "only a histogram observes" in observe_gauge
    assert "Missing required buckets" in no_buckets
    assert "Unexpected buckets found" in buckets_on_counter
    assert "already exists as a counter" in other_kind
    assert "reserved" in reserved
