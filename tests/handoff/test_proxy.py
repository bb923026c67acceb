"""inferd.handoff.worker.proxy: the worker's RemoteDataPlane is the whole façade, and the core answers exactly its calls."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from inferd.dataplane.plane import DataPlane
from inferd.facade import OPENAI_BATCH_CALLS, DataPlaneAPI, GrpcFastPath
from inferd.handoff.messages import CALLS
from inferd.handoff.worker.proxy import RemoteDataPlane


def _methods(cls: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(v) for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


def test_the_proxy_implements_every_facade_method_with_its_signature() -> None:
    api, proxy = _methods(DataPlaneAPI), _methods(RemoteDataPlane)
    assert set(api) <= set(proxy), f"missing in RemoteDataPlane: {sorted(set(api) - set(proxy))}"
    for name, signature in api.items():
        assert list(signature.parameters) == list(proxy[name].parameters), name


def test_the_proxy_offers_the_grpc_fast_path_the_servicer_takes_and_the_core_does_not() -> None:
    """gRPC ModelInfer in a worker goes through the façade's GrpcFastPath (the servicer asks once),
    with the declared signature; the in-process DataPlane offers none (its servicer decodes)."""
    from inferd.frontends.grpc_service import InferenceServicer

    declared = _methods(GrpcFastPath)
    assert set(declared) == {"grpc_infer"}
    assert list(declared["grpc_infer"].parameters) == list(_methods(RemoteDataPlane)["grpc_infer"].parameters)
    assert inspect.iscoroutinefunction(RemoteDataPlane.grpc_infer)
    proxy = RemoteDataPlane(None)  # type: ignore[arg-type]
    assert InferenceServicer(proxy).fast_path is proxy
    assert InferenceServicer(object.__new__(DataPlane)).fast_path is None  # type: ignore[arg-type]


def test_the_core_answers_every_control_call_and_nothing_else() -> None:
    api = set(_methods(DataPlaneAPI))
    # tracing_on is the worker's own answer (the core's flag, pushed to it in STATE messages): no hop.
    assert CALLS == (api - {"infer", "infer_stream", "tracing_on"}) | OPENAI_BATCH_CALLS
    assert all(hasattr(DataPlane, name) for name in CALLS)
    assert RemoteDataPlane.tracing_on(RemoteDataPlane(SimpleNamespace(tracing=True))) is True  # type: ignore[arg-type]
