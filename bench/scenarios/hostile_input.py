"""Hostile input over the wire (issue 16): 10,000 generated ModelInfer requests over gRPC and 10,000
    HTTP bodies (tests/hostile.py: valid requests for five models, then up to three hostile changes;
    garbage, deep and broken JSON) against one server, with the answers counted by status and the
    server's RSS read before and after. Nothing may be UNKNOWN, INTERNAL or a 5xx other than 503, and
    every error carries a message (the same checks as tests/test_hostile_input.py, which runs 150 of each
    over the wire per test run; ``INFERD_FUZZ_WIRE_EXAMPLES=10000 pytest tests/test_hostile_input.py -k
    wire`` is the same run under pytest). Undecodable bytes are not part of it: they are issue 14's.
    A longer check of memory (14 rounds of 2,000 per protocol, run by hand on 2026-12-01) kept the
    server's RSS between 124 and 146 MiB with no trend."""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent.parent / "tests"
EXAMPLES = int(os.environ.get("INFERD_FUZZ_WIRE_EXAMPLES", "10000"))


def run(quick: bool) -> dict:
    import grpc
    import tritonclient.grpc as grpcclient
    from hypothesis import HealthCheck, given, seed, settings

    sys.path.insert(0, str(TESTS))
    import hostile
    from conftest import ServerProcess
    from test_hostile_input import _Region, _rss_mib, check_grpc_answer, check_http_answer, grpc_answer, http_answer

    examples = 1000 if quick else EXAMPLES
    rounds = 5  # RSS is read after each round: it must not grow from round to round
    repo = hostile.build_repository(Path(tempfile.mkdtemp()) / "repo")
    region = _Region()
    server = ServerProcess(repo, ["--allow-client-shm"])  # a region the shared-memory cases aim past
    codes: dict[str, collections.Counter] = {"gRPC": collections.Counter(), "HTTP": collections.Counter()}
    timings: dict[str, float] = {"gRPC": 0.0, "HTTP": 0.0}
    rss: list[float] = []
    try:
        client = grpcclient.InferenceServerClient(server.url)
        client.register_system_shared_memory(hostile.REGION, region.key, hostile.REGION_BYTES)
        client.close()
        channel = grpc.insecure_channel(server.url)
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

        def grpc_check(data: bytes) -> None:
            code, details = grpc_answer(infer, data)
            check_grpc_answer(code, details)
            codes["gRPC"][code] += 1

        def http_check(case: tuple[str, bytes, dict[str, str]]) -> None:
            status, body = http_answer(server, *case)
            check_http_answer(status, body)
            codes["HTTP"][str(status)] += 1

        rss.append(_rss_mib(server.proc.pid))
        for n in range(rounds):
            each = settings(max_examples=examples // rounds, deadline=None, database=None,
                            suppress_health_check=list(HealthCheck))
            for proto, strategy, check in (("gRPC", hostile.grpc_requests(), grpc_check),
                                           ("HTTP", hostile.http_bodies(), http_check)):
                case = seed(16 * 100 + n)(each(given(strategy)(check)))
                t0 = time.monotonic()
                case()
                timings[proto] += time.monotonic() - t0
            rss.append(_rss_mib(server.proc.pid))
        channel.close()
        alive = server.proc.poll() is None
        tracebacks = server.log().count("Traceback")
    finally:
        code = server.stop()
        region.close()
        import shutil

        import conftest

        shutil.rmtree(conftest.LOG_DIR, ignore_errors=True)  # pytest's session hook would have removed it
    measures = [{"label": f"hostile {proto} requests over the wire", "concurrency": 1, "batch": 1,
                 "infer_per_s": sum(c.values()) / timings[proto], "p50_us": 0.0, "p99_us": 0.0,
                 "note": "answers: " + ", ".join(f"{k} {v:,}" for k, v in c.most_common())}
                for proto, c in codes.items()]
    return {"measures": measures, "codes": {k: dict(v) for k, v in codes.items()}, "rss_mib": rss,
            "alive": alive, "tracebacks": tracebacks, "exit_status": code,
            "notes": (f"{examples:,} generated requests per protocol, one at a time, in {rounds} rounds (the infer/s "
                      "column is how fast the client went, not a throughput figure). Server RSS (MiB) at start and "
                      f"after each round: {', '.join(f'{x:.0f}' for x in rss)} (it moves with the large transient "
                      f"tensors some requests carry); still serving after all of "
                      f"them: {alive}; tracebacks in its log: {tracebacks}; exit status after SIGTERM: {code}. "
                      "Shared 2-core machine.")}


def ratios(result: dict) -> dict:
    bad = {p: {k: v for k, v in c.items() if k in ("UNKNOWN", "INTERNAL") or (k.isdigit() and int(k) >= 500
                                                                             and k != "503")}
           for p, c in result["codes"].items()}
    return {"answers that are UNKNOWN, INTERNAL or 5xx (not 503)": str(bad),
            "server RSS after the first round / after the last (MiB)":
                f"{result['rss_mib'][1]:.0f} / {result['rss_mib'][-1]:.0f}"}
