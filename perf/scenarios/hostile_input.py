"""Hostile input over the wire (issue 16): 10,000 generated ModelInfer requests over gRPC and 10,000
    HTTP bodies (tests/hostile.py: valid requests for five models, then up to three hostile changes;
    garbage, deep and broken JSON) against one server, with the answers counted by status and the
    server's RSS read before and after. Nothing may be UNKNOWN, INTERNAL or a 5xx other than 503, and
    every error carries a message (the same checks as tests/test_hostile_input.py, which runs 150 of each
    over the wire per test run; ``INFERD_FUZZ_WIRE_EXAMPLES=10000 pytest tests/test_hostile_input.py -k
    wire`` is the same run under pytest). Undecodable bytes are not part of it: they are issue 14's."""

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
    from hypothesis import HealthCheck, given, settings

    sys.path.insert(0, str(TESTS))
    import hostile
    from conftest import ServerProcess
    from test_hostile_input import _Region, _rss_mib, check_grpc_answer, check_http_answer, grpc_answer, http_answer

    examples = 1000 if quick else EXAMPLES
    fuzz = settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
    repo = hostile.build_repository(Path(tempfile.mkdtemp()) / "repo")
    region = _Region()
    server = ServerProcess(repo)
    codes: dict[str, collections.Counter] = {"gRPC": collections.Counter(), "HTTP": collections.Counter()}
    timings: dict[str, float] = {}
    try:
        client = grpcclient.InferenceServerClient(server.url)
        client.register_system_shared_memory(hostile.REGION, region.key, hostile.REGION_BYTES)
        client.close()
        channel = grpc.insecure_channel(server.url)
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

        @fuzz
        @given(data=hostile.grpc_requests())
        def grpc_case(data: bytes) -> None:
            code, details = grpc_answer(infer, data)
            check_grpc_answer(code, details)
            codes["gRPC"][code] += 1

        @fuzz
        @given(case=hostile.http_bodies())
        def http_case(case: tuple[str, bytes, dict[str, str]]) -> None:
            status, body = http_answer(server, *case)
            check_http_answer(status, body)
            codes["HTTP"][str(status)] += 1

        rss_before = _rss_mib(server.proc.pid)
        for name, case in (("gRPC", grpc_case), ("HTTP", http_case)):
            t0 = time.monotonic()
            case()
            timings[name] = time.monotonic() - t0
        rss_after = _rss_mib(server.proc.pid)
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
    return {"measures": measures, "codes": {k: dict(v) for k, v in codes.items()},
            "rss_before_mib": rss_before, "rss_after_mib": rss_after, "alive": alive, "tracebacks": tracebacks,
            "exit_status": code,
            "notes": (f"{examples:,} generated requests per protocol, one at a time (the infer/s column is how fast "
                      f"the client went, not a throughput figure). Server RSS {rss_before:.0f} MiB before, "
                      f"{rss_after:.0f} MiB after; still serving after all of them: {alive}; tracebacks in its "
                      f"log: {tracebacks}; exit status after SIGTERM: {code}. Shared 2-core machine.")}


def ratios(result: dict) -> dict:
    bad = {p: {k: v for k, v in c.items() if k in ("UNKNOWN", "INTERNAL") or (k.isdigit() and int(k) >= 500
                                                                             and k != "503")}
           for p, c in result["codes"].items()}
    return {"answers that are UNKNOWN, INTERNAL or 5xx (not 503)": str(bad),
            "server RSS before / after (MiB)": f"{result['rss_before_mib']:.0f} / {result['rss_after_mib']:.0f}"}
