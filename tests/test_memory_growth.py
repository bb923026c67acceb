"""The server's memory stays flat under load, in each process mode: 50,000 identity requests
over gRPC at concurrency 16, the RSS of the whole process tree (core and frontend workers,
from /proc) sampled every 2,500 requests after a 10,000-request warm-up, and the slope of a
least-squares line through the samples bounded.

The bound, 200 bytes per request (10 MB over the measured 40,000), is for leaks of a
request's own objects (a dict entry, a future, a tensor kept per request): those are
hundreds of bytes to kilobytes each. It sits well above the noise of allocator arenas and
the collector's timing (a flat server measures tens of bytes per request or less here), so
the test does not flake, and well below what it exists to catch: the control in this file
runs the same measurement on a model that keeps 1 KiB per request and must exceed it. A
slower leak (the soak's ~40 bytes per request) is the soak's to find over a million
requests (bench/soak.py, bench/RESULTS.md)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import InferInput

from conftest import running
from inferd.examples.build import triton_config
from bench.proc_cpu import all_stats, server_tree

BOUND = 200  # bytes per request
CONCURRENCY = 16
SAMPLE_EVERY = 2_500

IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                             .as_numpy())]) for r in requests]
'''

# The control: keeps 1 KiB for every request, for the model's lifetime.
LEAKY = '''
import triton_python_backend_utils as pb_utils

KEPT = []


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            KEPT.append(bytes(1024))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                                   .as_numpy())]))
        return out
'''


def _model(repo: Path, name: str, source: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))
    (repo / name / "config.pbtxt").write_text(triton_config(
        name, [("IN", "TYPE_FP32", [16])], [("OUT", "TYPE_FP32", [16])], max_batch_size=8, platform=None,
        backend="python", extra="dynamic_batching { }\n"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("memory_growth")
    _model(repo, "identity", IDENTITY)
    _model(repo, "leaky", LEAKY)
    return repo


def _tree_rss(pid: int) -> int:
    total = 0
    for stat in server_tree(pid, all_stats()):
        try:
            for line in Path(f"/proc/{stat.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


async def _slope(server, model: str, warmup: int, measured: int,  # type: ignore[no-untyped-def]
                 sample_every: int = SAMPLE_EVERY) -> float:
    """Bytes of RSS the server's process tree gains per request, over ``measured`` requests."""
    client = aioclient.InferenceServerClient(server.url)
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    done = 0
    samples: list[tuple[int, int]] = []

    async def one() -> None:
        nonlocal done
        while done < warmup + measured:
            done += 1
            i = InferInput("IN", [1, 16], "FP32")
            i.set_data_from_numpy(data)
            result = await client.infer(model, [i])
            assert result.as_numpy("OUT").shape == (1, 16)
            if done >= warmup and done % sample_every == 0:
                samples.append((done, _tree_rss(server.proc.pid)))

    try:
        await asyncio.wait_for(asyncio.gather(*(one() for _ in range(CONCURRENCY))), timeout=600)
    finally:
        await client.close()
    x = np.array([s[0] for s in samples], dtype=np.float64)
    y = np.array([s[1] for s in samples], dtype=np.float64)
    assert len(samples) >= 8, samples
    return float(np.polyfit(x, y, 1)[0])


async def test_rss_stays_flat_over_50000_requests(repo):
    with running(repo) as server:
        slope = await _slope(server, "identity", warmup=10_000, measured=40_000)
    print(f"identity: {slope:.1f} bytes per request")
    assert slope < BOUND, f"the server's RSS grew {slope:.0f} bytes per request (bound {BOUND})"


@pytest.mark.fixed_mode  # the control proves the measurement, once: the default mode's half runs it
async def test_the_check_catches_a_leak_of_1_kib_per_request(repo):
    with running(repo) as server:
        # 1 KiB a request is 10 MiB over these 10,000: five times the bound, in half the requests
        slope = await _slope(server, "leaky", warmup=1_000, measured=10_000, sample_every=1_000)
    print(f"leaky: {slope:.1f} bytes per request")
    assert slope > BOUND, f"a 1 KiB-per-request leak measured only {slope:.0f} bytes per request"
