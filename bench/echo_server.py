"""The floor a single Python process can reach: a bare grpc.aio servicer.

It speaks just enough of GRPCInferenceService for perf_analyzer (metadata,
config, statistics) and answers ModelInfer by echoing its inputs back as
outputs: no model, no batching, no validation. inferd's request path is
measured against it in the same run (bench/bench.py).

    python -m bench.echo_server --port 8101 [--event-loop asyncio|uvloop]

On asyncio's own loop (the default) it is the issue's floor, bare grpc.aio; on uvloop, the floor
for a server on the loop inferd serves on by default.
"""

from __future__ import annotations

import argparse

import grpc

from inferd import event_loop
from inferd._proto import grpc_service_pb2 as pb
from inferd._proto import grpc_service_pb2_grpc as pb_grpc
from inferd._proto import model_config_pb2 as mc

NAME = "identity_fp32"


class EchoServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self) -> None:
        self.inferences = 0  # answered ModelInfer calls: bench/proc_cpu.py divides CPU by it

    async def ServerLive(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request, context):  # type: ignore[no-untyped-def]
        return pb.ServerMetadataResponse(name="echo", version="0")

    async def ModelMetadata(self, request, context):  # type: ignore[no-untyped-def]
        T = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=request.name, versions=["1"], platform="onnxruntime_onnx",
            inputs=[T(name="INPUT0", datatype="FP32", shape=[-1, -1])],
            outputs=[T(name="OUTPUT0", datatype="FP32", shape=[-1, -1])],
        )

    async def ModelConfig(self, request, context):  # type: ignore[no-untyped-def]
        config = mc.ModelConfig(name=request.name, platform="onnxruntime_onnx", max_batch_size=64)
        config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[-1])
        config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[-1])
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request, context):  # type: ignore[no-untyped-def]
        response = pb.ModelStatisticsResponse()
        response.model_stats.add(name=NAME, version="1", inference_count=self.inferences)
        return response

    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
        response = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        for tensor in request.inputs:
            response.outputs.add(name="OUTPUT0", datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.extend(request.raw_input_contents)
        self.inferences += 1
        return response


async def serve(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(EchoServicer(), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"echo server on 127.0.0.1:{bound}", flush=True)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8101)
    parser.add_argument("--event-loop", choices=event_loop.KINDS, default="asyncio")
    args = parser.parse_args()
    event_loop.run(serve(args.port), args.event_loop)


if __name__ == "__main__":
    main()
