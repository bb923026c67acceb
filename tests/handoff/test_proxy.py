"""inferd.handoff.proxy: the worker's RemoteDataPlane is the whole façade, and the core answers exactly its calls."""

from __future__ import annotations

import inspect

from inferd.facade import DataPlaneAPI
from inferd.dataplane.plane import DataPlane
from inferd.handoff.proxy import CALLS, RemoteDataPlane


def _methods(cls: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(v) for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


def test_the_proxy_implements_every_facade_method_with_its_signature() -> None:
    api, proxy = _methods(DataPlaneAPI), _methods(RemoteDataPlane)
    assert set(api) <= set(proxy), f"missing in RemoteDataPlane: {sorted(set(api) - set(proxy))}"
    for name, signature in api.items():
        assert list(signature.parameters) == list(proxy[name].parameters), name


def test_the_core_answers_every_control_call_and_nothing_else() -> None:
    api = set(_methods(DataPlaneAPI))
    assert CALLS == api - {"infer", "infer_stream"}
    assert all(hasattr(DataPlane, name) for name in CALLS)
