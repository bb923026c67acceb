"""Model hosts on real servers (issue 48), in both process modes: each Python instance in a process
of its own; a model that ignores its client's cancel is stopped with its host; a host that crashes
mid-batch fails that batch clearly, restarts, and no other model notices; unloading gives the
model's memory back to the system; SIGTERM ends the whole tree within --exit-timeout-secs even
with a model stuck in execute.

Nothing here waits on a time guess: every wait is for a state (a metric, a file, a process gone),
bounded in time only as a failure."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import ServerProcess, running, until
from inferd.examples import onnx_models as om
from inferd.hosts import priority
from repo_builder import add_model, add_python_model, config

# Notes each process that imports it (its config needs no import: nothing to auto-complete).
PID_MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils

with open(os.path.join(os.path.dirname(__file__), "imported_by"), "a") as imported:
    imported.write(f"{os.getpid()}\\n")


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
                for _ in requests]
'''

# Sends forever, catching the "closed sender" error a send raises once its client has gone.
RUNAWAY = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._flood, args=(request.get_response_sender(),), daemon=True).start()

    def _flood(self, sender):
        i = 0
        while True:
            try:
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("N", np.array([i], np.int64))]))
            except pb_utils.TritonModelException:
                pass  # ignored: the model carries on
            i += 1
'''

# Dies of a segmentation fault when asked (X = 1), else answers X.
CRASHER = '''
import ctypes
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if int(x[0]) == 1:
                ctypes.string_at(0)  # SIGSEGV
            out.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x)]))
        return out
'''

# Keeps 160 MiB alive past its unload, in a module every model of a process shares: in one process
# it would never be given back; in a host it goes with the process.
LEAKY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        block = np.ones(160 * 2**20, np.uint8)  # touched: resident
        json.__dict__.setdefault("_leaked", []).append(block)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", np.array([1], np.int64))])
                for _ in requests]
'''

# Never returns from execute (it announces that it has begun in its model folder).
STUCK = '''
import os
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "executing")

    def execute(self, requests):
        open(self.marker, "w").close()
        while True:
            time.sleep(0.01)
'''

# The nice and scheduling policy of every thread of its process while it initializes and while it executes:
# [min, max] of each, a thread's as nice + 100 * policy.
NICENESS = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


def _nices():
    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            found.append(os.getpriority(os.PRIO_PROCESS, int(tid)) + 100 * os.sched_getscheduler(int(tid)))
        except OSError:  # ended meanwhile
            pass
    return [min(found), max(found)]


class TritonPythonModel:
    def initialize(self, args):
        self.loading = _nices()

    def execute(self, requests):
        out = np.array(self.loading + _nices(), np.int64)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("NICE", out)]) for _ in requests]
'''

INT64_OUT = '''
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "X" data_type: TYPE_INT64 dims: [ 1 ] }} ]
    output [ {{ name: "{out}" data_type: TYPE_INT64 dims: [ 1 ] }} ]
    {extra}
'''


def _python(repo: Path, name: str, source: str, out: str, extra: str = "") -> None:
    add_python_model(repo, name, source, INT64_OUT.format(out=out, extra=extra))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("hosts")
    _python(repo, "pids", PID_MODEL, "PID", "instance_group [ { count: 2 kind: KIND_CPU } ]")
    _python(repo, "runaway", RUNAWAY, "N", "model_transaction_policy { decoupled: true }")
    _python(repo, "crasher", CRASHER, "Y")
    add_python_model(repo, "niceness", NICENESS, '''
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_INT64 dims: [ 1 ] } ]
        output [ { name: "NICE" data_type: TYPE_INT64 dims: [ 4 ] } ]
    ''')
    add_model(repo, "identity", om.identity(np.float32, [4], batch=True),
              config("identity", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], max_batch_size=8))
    return repo


@pytest.fixture(scope="module")
def server(repo: Path):
    # A crash is logged with the host's own traceback-free report; the runaway's refusals are not errors.
    with running(repo, no_traceback=False) as s:
        yield s


def _x(value: int) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("X", [1], "INT64")
    x.set_data_from_numpy(np.array([value], np.int64))
    return [x]


def _wait_for(check, what: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    value = until(check, timeout)
    if not value:
        raise AssertionError(f"timed out waiting for {what}")
    return value


def _restarts(server: ServerProcess, model: str) -> float:
    return server.metric("inferd_model_host_restarts_total", f'{{model="{model}"}}') or 0.0


def test_each_instance_of_a_python_model_runs_in_a_host_process_of_its_own(server: ServerProcess, client,
                                                                          repo: Path) -> None:
    assert server.metric("inferd_model_host_processes", '{model="pids"}') == 2
    pid = int(client.infer("pids", _x(0)).as_numpy("PID")[0])
    assert pid != server.proc.pid and pid in server.group()  # a child in the server's group, not the core
    importers = {int(line) for line in (repo / "pids" / "1" / "imported_by").read_text().split()}
    assert pid in importers and server.proc.pid not in importers  # the core never imported the model's module
    stats = client.get_inference_statistics("pids", as_json=True)["model_stats"][0]
    memory = stats["memory_usage"]
    assert memory and int(memory[0]["byte_size"]) > 10 * 2**20  # the hosts' resident memory: the footprint
    assert server.metric("inferd_model_host_processes", '{model="identity"}') is None  # ONNX stays in the core


@pytest.mark.skipif(not priority.can_restore(),
                    reason="this machine may not raise a thread's priority back (no CAP_SYS_NICE, RLIMIT_NICE 0): "
                           "hosts start and load at their normal priority here")
def test_a_host_starts_and_loads_at_the_lowest_priority_and_serves_at_the_servers(server: ServerProcess,
                                                                                  client) -> None:
    """A host is forked at the lowest priority (SCHED_IDLE, nice 19) and every thread of it (its loop's too)
    stays there until its model is loaded, so a load gives way to warm requests from its fork on; then all
    of them serve at the server's nice and policy."""
    nice = client.infer("niceness", _x(0)).as_numpy("NICE").tolist()
    low = priority.LOAD_NICE + 100 * priority.LOAD_POLICY
    serving = os.getpriority(os.PRIO_PROCESS, server.proc.pid) + 100 * os.sched_getscheduler(server.proc.pid)
    assert nice == [low, low, serving, serving]


def test_a_model_that_keeps_sending_after_its_client_left_is_stopped_with_its_host(server: ServerProcess) -> None:
    before = _restarts(server, "runaway")
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("runaway", _x(0))
    for _ in range(3):
        result, error = got.get(timeout=60)
        assert error is None, error
    client.stop_stream(cancel_requests=True)  # the client leaves; the model ignores it
    client.close()
    _wait_for(lambda: _restarts(server, "runaway") == before + 1, "the runaway model's host to be stopped")
    # Its host restarted: the model serves again (and is stopped again when that client leaves).
    again = grpcclient.InferenceServerClient(server.url)
    got = queue.Queue()
    again.start_stream(callback=lambda result, error: got.put((result, error)))
    again.async_stream_infer("runaway", _x(0))
    result, error = got.get(timeout=60)
    assert error is None and int(result.as_numpy("N")[0]) == 0
    again.stop_stream(cancel_requests=True)
    again.close()
    _wait_for(lambda: _restarts(server, "runaway") == before + 2, "the restarted host to be stopped too")


def test_a_host_that_segfaults_mid_batch_fails_that_batch_restarts_and_no_other_model_notices(
        server: ServerProcess, client) -> None:
    before = _restarts(server, "crasher")
    assert int(client.infer("crasher", _x(7)).as_numpy("Y")[0]) == 7
    failures: list[Exception] = []
    stop = threading.Event()

    def other_traffic() -> None:  # another model, served throughout
        other = grpcclient.InferenceServerClient(server.url)
        data = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        data.set_data_from_numpy(np.ones((1, 4), np.float32))
        for _ in range(2000):
            if stop.is_set():
                break
            try:
                other.infer("identity", [data])
            except Exception as exc:  # noqa: BLE001  (any failure is the finding)
                failures.append(exc)
        other.close()

    thread = threading.Thread(target=other_traffic)
    thread.start()
    try:
        with pytest.raises(InferenceServerException) as crashed:
            client.infer("crasher", _x(1))
        message = crashed.value.message()
        assert crashed.value.status() == "StatusCode.UNAVAILABLE", crashed.value
        assert "model 'crasher'" in message and "SIGSEGV" in message and "restarted" in message, message
        _wait_for(lambda: _restarts(server, "crasher") == before + 1, "the crash to be counted")

        def serves() -> bool:
            try:
                return int(client.infer("crasher", _x(5)).as_numpy("Y")[0]) == 5
            except InferenceServerException:
                return False

        _wait_for(serves, "the crasher's new host to serve")
    finally:
        stop.set()
        thread.join(60)
    assert failures == []


def _tree_rss(server: ServerProcess) -> int:
    total = 0
    for pid in server.group():
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError):
            pass
    return total


def test_unloading_a_hosted_model_gives_its_memory_back(tmp_path: Path) -> None:
    _python(tmp_path, "leaky", LEAKY, "Y")
    _python(tmp_path, "first", PID_MODEL, "PID")
    with running(tmp_path, extra_args=["--model-control-mode", "explicit"]) as server:
        client = grpcclient.InferenceServerClient(server.url)
        client.load_model("first")  # the host zygote starts with the first host: the base counts it
        base = _tree_rss(server)
        client.load_model("leaky")
        assert client.infer("leaky", _x(0)).as_numpy("Y")[0] == 1
        loaded = _tree_rss(server)
        assert loaded - base > 150 * 2**20, (base, loaded)
        client.unload_model("leaky")
        _wait_for(lambda: server.metric("inferd_model_host_processes", '{model="leaky"}') is None,
                  "the host to be gone")
        after = _tree_rss(server)
        assert after - base < 16 * 2**20, (base, loaded, after)  # back within a few MiB
        client.close()


def test_under_a_memory_budget_a_large_onnx_model_loads_in_a_host_and_a_small_one_in_the_core(
        tmp_path: Path) -> None:
    from inferd.examples.many_models import add_table_model, expected
    from inferd.hosts.registry import HOST_AT_BYTES

    add_table_model(tmp_path, "large", 0, HOST_AT_BYTES // 4 + 1024)  # float32: just over the threshold
    add_table_model(tmp_path, "small", 1, HOST_AT_BYTES // 4 - 1024)  # just under it
    with running(tmp_path, extra_args=["--model-control-mode", "on_demand", "--model-memory-budget", "256MiB"]) as server:
        client = grpcclient.InferenceServerClient(server.url)
        for index, name in enumerate(("large", "small")):
            x = grpcclient.InferInput("I", [1], "INT64")
            x.set_data_from_numpy(np.array([5], np.int64))
            assert float(client.infer(name, [x]).as_numpy("Y")[0]) == expected(index, 5)
        assert server.metric("inferd_model_host_processes", '{model="large"}') == 1
        assert server.metric("inferd_model_host_processes", '{model="small"}') is None
        client.close()


def test_sigterm_ends_the_tree_within_the_exit_timeout_with_a_model_stuck_in_execute(tmp_path: Path) -> None:
    _python(tmp_path, "stuck", STUCK, "Y")
    exit_timeout = 3.0
    server = ServerProcess(tmp_path, ["--exit-timeout-secs", str(exit_timeout)])
    try:
        client = grpcclient.InferenceServerClient(server.url)
        answers: queue.Queue = queue.Queue()
        client.async_infer("stuck", _x(0), callback=lambda result, error: answers.put(error))
        _wait_for(lambda: (tmp_path / "stuck" / "executing").exists(), "the model to be executing")
        sent = time.monotonic()
        os.kill(server.proc.pid, signal.SIGTERM)
        _wait_for(lambda: not server.group(), "the server's process tree to end", timeout=exit_timeout + 10)
        took = time.monotonic() - sent
        # The exit timeout bounds it, not the old watchdog's timeout + 5 s: 2 s of slack for a loaded host.
        assert took < exit_timeout + 2.0, took
        error = answers.get(timeout=10)
        assert error is not None and error.status() == "StatusCode.UNAVAILABLE", error
        client.close()
    finally:
        server.stop()
    assert not server.left_behind


def _zygote_of(server: ServerProcess) -> int:
    """The core's child named inferd-zygote (a host it has just forked bears that name too, until it
    names itself host:<model>, but its parent is the zygote)."""
    def is_zygote(pid: int) -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()  # "pid (comm) state ppid ..."
        except OSError:  # gone since the group was listed
            return False
        name, ppid = stat[stat.index("(") + 1:stat.rindex(")")], int(stat[stat.rindex(")") + 2:].split()[1])
        return name == "inferd-zygote" and ppid == server.proc.pid

    pids = [p for p in server.group() if is_zygote(p)]
    assert len(pids) == 1, pids
    return pids[0]


def test_the_zygote_has_onnx_runtime_loaded_before_it_forks(server: ServerProcess) -> None:
    """An ONNX model's host is forked with ONNX Runtime imported: its import (~55 ms of CPU, 9 MiB of
    each host's private memory in bench/RESULTS.md many_models) is paid once, and its pages are shared."""
    maps = Path(f"/proc/{_zygote_of(server)}/maps").read_text()
    assert "onnxruntime_pybind11_state" in maps


def test_a_killed_zygote_takes_its_hosts_and_the_next_host_starts_another(server: ServerProcess, client) -> None:
    """Hosts die with the zygote that forked them; the core sees each host go (its pidfd: the zygote that
    would report the status is gone too), restarts it through a new zygote, and serves again."""
    before = _restarts(server, "crasher")
    old = _zygote_of(server)
    os.kill(old, signal.SIGKILL)
    _wait_for(lambda: _restarts(server, "crasher") == before + 1, "the crasher's host to be restarted")

    def serves() -> bool:
        try:
            return int(client.infer("crasher", _x(3)).as_numpy("Y")[0]) == 3
        except InferenceServerException:
            return False

    _wait_for(serves, "the crasher to serve from a new host")
    assert _zygote_of(server) != old
