"""Faults in models survived (issue 16), against one server in its default process mode, with the
    models of tests/test_faults.py: a Python model that sleeps when asked ("hang", with
    inferd.execution_timeout_microseconds 300000), one that raises on 13, one that keeps 1 MiB an
    execution ("leaky"), and an ONNX identity ("other"). Measured: a 3 s execution past its 0.3 s limit
    (when its caller got DEADLINE_EXCEEDED, how long the next request of the model took while the retired
    thread still slept: the replacement, and what "other" served meanwhile); one raising request among
    100 (what the other 99 got); 40 executions of the leak against the memory metric and the server's RSS;
    the model file corrupted before a reload (what the old version served meanwhile); SIGKILL and a
    restart on the same ports (seconds until a request is served again). Shared 2-core machine."""

from __future__ import annotations

import collections
import re
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent.parent.parent / "tests"


def _metric(url: str, name: str, labels: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


def _code(fn) -> str:  # type: ignore[no-untyped-def]
    from tritonclient.utils import InferenceServerException

    try:
        fn()
        return "OK"
    except InferenceServerException as exc:
        return str(exc.status()).removeprefix("StatusCode.")


def _model_faults(repo: Path, measures: list[dict], facts: dict) -> None:
    import tritonclient.grpc as grpcclient

    from conftest import ServerProcess, group_members
    from test_faults import _infer
    from test_hostile_input import _rss_mib

    server = ServerProcess(repo)
    try:
        client = grpcclient.InferenceServerClient(server.url)
        _infer(client, "hang", [1.0])
        # A stuck execution: its caller's answer, the next request (a new instance), "other" meanwhile.
        served, latencies = 0, []
        with ThreadPoolExecutor(1) as pool:
            t0 = time.monotonic()
            stuck = pool.submit(lambda: (_code(lambda: _infer(client, "hang", [-3.0])), time.monotonic() - t0))
            while not stuck.done():
                s = time.monotonic()
                _infer(client, "other", [1.0])
                latencies.append(time.monotonic() - s)
                served += 1
            stuck_code, stuck_s = stuck.result()
        s = time.monotonic()
        next_code = _code(lambda: _infer(client, "hang", [2.0]))
        replaced_ms = (time.monotonic() - s) * 1e3
        latencies.sort()
        measures.append({"label": "other model while 'hang' is stuck", "concurrency": 1, "batch": 1,
                         "infer_per_s": served / stuck_s, "p50_us": latencies[len(latencies) // 2] * 1e6,
                         "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
                         "note": f"{served} served in the {stuck_s:.2f} s before the stuck call was answered"})
        facts["stuck"] = {"answer": stuck_code, "answered_after_s": stuck_s, "next_request": next_code,
                          "next_request_ms": replaced_ms, "other_served": served,
                          "timeouts_counted": _metric(server.metrics_url, "inferd_inference_request_failure_total",
                                                      '{model="hang",reason="TIMEOUT",version="1"}')}
        # One raising request among 100, 4 at a time (batches of their own: no dynamic batching).
        with ThreadPoolExecutor(4) as pool:
            codes = list(pool.map(lambda i: _code(lambda: _infer(client, "raiser", [13.0 if i == 50 else 100.0 + i])),
                                  range(100)))
        facts["raiser"] = dict(collections.Counter(codes))
        # A leak: 40 executions keep 1 MiB each.
        rss_before = _rss_mib(server.proc.pid)
        for i in range(40):
            _infer(client, "leaky", [float(i)])
        facts["leak"] = {"kept_mib": 40, "metric_mib": _metric(server.metrics_url, "inferd_model_memory_growth_bytes",
                                                               '{model="leaky",version="1"}') / 2**20,
                         "raiser_metric_mib": _metric(server.metrics_url, "inferd_model_memory_growth_bytes",
                                                      '{model="raiser",version="1"}') / 2**20,
                         "rss_growth_mib": _rss_mib(server.proc.pid) - rss_before,
                         "processes": len(group_members(server.proc.pid))}
        client.close()
    finally:
        facts["exit_status"] = server.stop()
        log = server.log()
        facts["tracebacks_besides_the_raiser"] = log.count("Traceback") - log.count("model 'raiser': execute raised")


def _corrupt_reload(tmp: Path, facts: dict) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from conftest import ServerProcess
    from inferd.examples import onnx_models as om
    from repo_builder import add_model, config
    from test_faults import _infer

    model_dir = add_model(tmp, "m", om.identity(np.float32, [-1], batch=False), config(
        "m", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    server = ServerProcess(tmp, ["--model-control-mode", "explicit", "--load-model", "m"])
    try:
        client = grpcclient.InferenceServerClient(server.url)
        onnx = model_dir / "1" / "model.onnx"
        data = onnx.read_bytes()
        onnx.write_bytes(data[: len(data) // 2] + b"\x00garbage" * 64)
        with ThreadPoolExecutor(1) as pool:  # requests keep coming while the reload fails
            stop = time.monotonic() + 3
            during = pool.submit(lambda: collections.Counter(
                _code(lambda: _infer(client, "m", [1.0])) for _ in iter(lambda: time.monotonic() < stop, False)))
            try:
                client.load_model("m")
                load = "OK"
            except InferenceServerException as exc:
                load = exc.message()
            codes = during.result()
        entry = next(e for e in client.get_model_repository_index().models if e.name == "m")
        facts["corrupt_reload"] = {"load_answer": load[:200], "served_meanwhile": dict(codes),
                                   "state": entry.state, "reason": entry.reason[:240]}
        client.close()
    finally:
        server.stop()


def _sigkill_restart(tmp: Path, facts: dict) -> None:
    import signal

    import tritonclient.grpc as grpcclient

    from conftest import ServerProcess
    from inferd.examples import onnx_models as om
    from repo_builder import add_model, config
    from test_faults import _free_port, _infer

    add_model(tmp, "m", om.identity(np.float32, [-1], batch=False), config(
        "m", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    ports = ["--grpc-port", str(_free_port()), "--http-port", str(_free_port()), "--metrics-port", str(_free_port())]
    first = ServerProcess(tmp, ports)
    client = grpcclient.InferenceServerClient(first.url)
    for i in range(50):
        _infer(client, "m", [float(i)])
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)
    first.stop()  # frontend workers left behind by the killed core are recorded (then killed)
    client.close()
    t0 = time.monotonic()
    second = ServerProcess(tmp, ports)
    try:
        client = grpcclient.InferenceServerClient(second.url)
        ok = _infer(client, "m", [7.0]).as_numpy("OUTPUT0").tolist() == [7.0]
        facts["sigkill_restart"] = {"served_again": ok, "seconds_to_serve": time.monotonic() - t0,
                                    "same_grpc_port": second.url == first.url,
                                    "left_behind_by_the_kill": len(first.left_behind)}
        client.close()
    finally:
        second.stop()


def run(quick: bool) -> dict:
    sys.path.insert(0, str(TESTS))
    import shutil

    import conftest
    from repo_builder import add_model, config
    from test_faults import HANG, LEAKY, TIMEOUT, _python_model

    from inferd.examples import onnx_models as om

    work = Path(tempfile.mkdtemp())
    repo = work / "faults"
    _python_model(repo, "hang", HANG, TIMEOUT)
    _python_model(repo, "raiser", HANG)
    _python_model(repo, "leaky", LEAKY)
    add_model(repo, "other", om.identity(np.float32, [-1], batch=False), config(
        "other", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    measures: list[dict] = []
    facts: dict = {}
    try:
        _model_faults(repo, measures, facts)
        _corrupt_reload(work / "reload", facts)
        _sigkill_restart(work / "kill", facts)
    finally:
        shutil.rmtree(conftest.LOG_DIR, ignore_errors=True)  # pytest's session hook would have removed it
        shutil.rmtree(work, ignore_errors=True)
    return {"measures": measures, "facts": facts, "notes": _notes(facts)}


def _notes(f: dict) -> str:
    s, leak, r, k = f["stuck"], f["leak"], f["corrupt_reload"], f["sigkill_restart"]
    return (
        f"Stuck execution (3 s, limit 0.3 s): its caller got {s['answer']} after {s['answered_after_s']:.2f} s; "
        f"the next request of the model got {s['next_request']} in {s['next_request_ms']:.0f} ms (a new instance "
        f"while the retired thread still slept); 'other' served {s['other_served']} meanwhile; TIMEOUT failures "
        f"counted: {s['timeouts_counted']:.0f}. One raising request among 100: {f['raiser']}. Leak of 40 MiB "
        f"(40 executions of 1 MiB): inferd_model_memory_growth_bytes says {leak['metric_mib']:.1f} MiB for it, "
        f"{leak['raiser_metric_mib']:.1f} MiB for a model that keeps nothing; the core's RSS (the server: "
        f"{leak['processes']} processes) grew {leak['rss_growth_mib']:.0f} MiB. Server exit status after SIGTERM: {f['exit_status']}; "
        f"tracebacks besides the raiser's: {f['tracebacks_besides_the_raiser']}.\n\n"
        f"Model file corrupted before a reload: the load answered '{r['load_answer']}'; requests meanwhile: "
        f"{r['served_meanwhile']}; the model is {r['state']}, reason '{r['reason']}'.\n\n"
        f"SIGKILL, then the same command again: served again: {k['served_again']}, "
        f"{k['seconds_to_serve']:.1f} s from the start to the first answer, on the same ports: {k['same_grpc_port']}; "
        f"processes of the killed server left running: {k['left_behind_by_the_kill']}."
    )


def ratios(result: dict) -> dict:
    f = result.get("facts", {})
    if not f:
        return {}
    return {
        "stuck execution: caller's answer / next request's answer": f"{f['stuck']['answer']} / "
                                                                    f"{f['stuck']['next_request']}",
        "leak: memory metric / memory kept (MiB)": f"{f['leak']['metric_mib']:.1f} / {f['leak']['kept_mib']}",
        "SIGKILL then restart: seconds to the first answer": f"{f['sigkill_restart']['seconds_to_serve']:.1f}",
    }
