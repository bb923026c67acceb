"""The client-side pipeline an ensemble replaces: call models one after another.

Each "sequence" sends INPUT0 to the first model, forwards its OUTPUT0 bytes
untouched as the next model's INPUT0, and so on (no decode/re-encode: the
cheapest a client can chain). ``concurrency`` workers run sequences back to
back over one grpc.aio channel with inferd's own stubs; the result is
sequences per second and the latency percentiles of a whole sequence.

    python -m bench.sequential_client --url 127.0.0.1:8001 --models ens_scale,ens_mlp,ens_relu
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

import grpc
import numpy as np

from inferd._proto import grpc_service_pb2 as pb
from inferd._proto import grpc_service_pb2_grpc as pb_grpc


@dataclass
class SequenceResult:
    concurrency: int
    sequences_per_s: float
    p50_us: float
    p99_us: float
    count: int


def _request(model: str, shape: list[int], data: bytes) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    request.raw_input_contents.append(data)
    return request


async def run_sequences(url: str, models: list[str], concurrency: int, seconds: float, warmup: float = 0.5,
                        width: int = 256) -> SequenceResult:
    x = np.random.default_rng(0).standard_normal((1, width), dtype=np.float32)
    shape = list(x.shape)
    first = x.tobytes()
    latencies: list[float] = []
    options = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]
    async with grpc.aio.insecure_channel(url, options=options) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        start = time.perf_counter()
        measure_from = start + warmup
        stop_at = measure_from + seconds

        async def worker() -> None:
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at:
                    return
                data = first
                for model in models:
                    response = await stub.ModelInfer(_request(model, shape, data))
                    data = response.raw_output_contents[0]
                t1 = time.perf_counter()
                if t0 >= measure_from and t1 <= stop_at:
                    latencies.append(t1 - t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    lat = np.array(latencies) * 1e6
    return SequenceResult(
        concurrency=concurrency,
        sequences_per_s=len(latencies) / seconds,
        p50_us=float(np.percentile(lat, 50)) if len(lat) else 0.0,
        p99_us=float(np.percentile(lat, 99)) if len(lat) else 0.0,
        count=len(latencies),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sequential_client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--models", default="ens_scale,ens_mlp,ens_relu", help="comma-separated, in call order")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    result = asyncio.run(run_sequences(args.url, args.models.split(","), args.concurrency, args.seconds))
    print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
