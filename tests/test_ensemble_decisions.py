"""Issue #30: ensembles that decide. Conditional steps (a cascade), per-row predicates that split
a batch and merge it back in order, routing, refused rules, and bounded in-flight work, through
tritonclient against a real ``inferd serve``; the scheduler's decisions with fake models.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from conftest import ServerProcess
from gated_model import add_gated_model, release, wait_pending_async, wait_started_async
from inferd.examples import build
from inferd.examples import onnx_models as om
from repo_builder import add_model
# server and client: test_ensemble's fixtures, here over this module's repo
from test_ensemble import (add_ensemble, client, fake_model, identity_fn, io, make_ensemble, onnx_config, request,
                           server, steps_text)

D = build.CASCADE_D
LIMIT = 2  # the slow chain's max_inflight_requests


def ensemble(name: str, steps, rules: dict[str, str], inputs=(("INPUT0", "TYPE_FP32", [D]),),  # type: ignore[no-untyped-def]
             outputs=(("OUTPUT0", "TYPE_FP32", [D]),), max_batch_size: int = 8, max_inflight: int = 0) -> str:
    return (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
            + io(inputs=inputs, outputs=outputs) + build.parameters(rules) + steps_text(steps, max_inflight))


CASCADE_STEPS = [("cascade_cheap", {"INPUT0": "INPUT0"}, {"OUTPUT0": "cheap_out", "SCORE": "SCORE"}),
                 ("cascade_expensive", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})]
LANG = ("LANG", "TYPE_STRING", [1])


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("decision_gates")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, gates: Path) -> Path:
    repo = tmp_path_factory.mktemp("decision_repo")
    build.build_repository(repo, models=[s for s in build.MODELS if s.name.startswith("cascade")], log=None)
    for name, factor in (("to_de", 2.0), ("to_en", 3.0), ("to_fr", 5.0)):
        add_model(repo, name, om.scale(D, factor), onnx_config(name, 8, "dynamic_batching { }\n",
                                                               inputs=(("INPUT0", "TYPE_FP32", [D]),),
                                                               outputs=(("OUTPUT0", "TYPE_FP32", [D]),)))
    # the whole request: the expensive step only when the cheap one is unsure of every row
    add_ensemble(repo, "cascade_all", ensemble("cascade_all", CASCADE_STEPS, {
        "inferd.step.1.when": "max(SCORE) < 0.8", "inferd.step.1.otherwise": "OUTPUT0=cheap_out"}))
    add_ensemble(repo, "router", ensemble("router", [("to_de", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})], {
        "inferd.step.0.route_by": "LANG", "inferd.step.0.route": "de=to_de,en=to_en,fr=to_fr"},
        inputs=(("INPUT0", "TYPE_FP32", [D]), LANG)))
    # a fast step feeding a slow one (held by its gate), and a step whose queue fills
    add_gated_model(repo, "slow", gates / "slow", max_batch_size=8, dims=(D,), extra="dynamic_batching { }\n")
    add_gated_model(repo, "narrow", gates / "narrow", max_batch_size=1, dims=(D,),
                    extra="dynamic_batching { default_queue_policy { max_queue_size: 1 } }\n")
    add_ensemble(repo, "fast_slow", ensemble("fast_slow", [("to_de", {"INPUT0": "INPUT0"}, {"OUTPUT0": "x"}),
                                                           ("slow", {"INPUT0": "x"}, {"OUTPUT0": "OUTPUT0"})],
                                             {}, max_inflight=LIMIT))
    add_ensemble(repo, "to_narrow", ensemble("to_narrow", [("to_de", {"INPUT0": "INPUT0"}, {"OUTPUT0": "x"}),
                                                           ("narrow", {"INPUT0": "x"}, {"OUTPUT0": "OUTPUT0"})], {},
                                             max_batch_size=1))
    bad = {
        "bad_tensor": {"inferd.step.1.when": "max(CONFIDENCE) < 0.8", "inferd.step.1.otherwise": "OUTPUT0=cheap_out"},
        "bad_type": {"inferd.step.1.when_row": 'SCORE == "sure"', "inferd.step.1.otherwise": "OUTPUT0=cheap_out"},
        "bad_shape": {"inferd.step.1.when": "cheap_out < 0.8", "inferd.step.1.otherwise": "OUTPUT0=cheap_out"},
        "bad_branch": {"inferd.step.1.when": "max(SCORE) < 0.8"},
        "bad_syntax": {"inferd.step.1.when": "SCORE is low", "inferd.step.1.otherwise": "OUTPUT0=cheap_out"},
        "bad_fallback": {"inferd.step.1.when": "min(cheap_out) > 9", "inferd.step.1.otherwise": "OUTPUT0=SCORE"},
    }
    no_score = [(CASCADE_STEPS[0][0], CASCADE_STEPS[0][1], {"OUTPUT0": "cheap_out"}), CASCADE_STEPS[1]]
    for name, rules in bad.items():
        add_ensemble(repo, name, ensemble(name, no_score if name == "bad_shape" else CASCADE_STEPS, rules))
    add_ensemble(repo, "bad_route", ensemble("bad_route", [("to_de", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})], {
        "inferd.step.0.route_by": "LANG", "inferd.step.0.route": "de=to_de,en=narrow"},
        inputs=(("INPUT0", "TYPE_FP32", [D]), LANG)))
    return repo


def rows(sure: list[bool]) -> np.ndarray:
    """One row per entry: a row the cheap model is sure of (a large element) or unsure of."""
    x = np.random.default_rng(len(sure)).uniform(-1, 0, (len(sure), D)).astype(np.float32)
    for i, s in enumerate(sure):
        if s:
            x[i, i % D] = 4.0  # sigmoid(4) = 0.98
    return x


async def infer(client, model: str, x: np.ndarray, lang: str | None = None, **kw):  # type: ignore[no-untyped-def]
    i = aioclient.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    inputs = [i]
    if lang is not None:
        t = aioclient.InferInput("LANG", [len(x), 1], "BYTES")
        t.set_data_from_numpy(np.array([[lang.encode()]] * len(x), dtype=object))
        inputs.append(t)
    return (await client.infer(model, inputs, **kw)).as_numpy("OUTPUT0")


async def count(client, model: str) -> int:  # type: ignore[no-untyped-def]
    return (await client.get_inference_statistics(model)).model_stats[0].inference_count


def step_metrics(server: ServerProcess, model: str) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    found = {}
    for m in re.finditer(r'^inferd_ensemble_step_requests_total\{(.*)\} (\S+)$', text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels["model"] == model:
            found[(labels["step"], labels["step_model"], labels["outcome"])] = float(m.group(2))
    return found


def expensive(x: np.ndarray) -> np.ndarray:
    return om.mlp_reference(x, om.mlp_weights(D, 256, D, seed=build.MLP_SEED))


# -- through tritonclient --------------------------------------------------------------------


async def test_cascade_answers_as_bls_and_skips_the_expensive_model(client, server):
    sure = [True, True, True]
    before = await count(client, "cascade_expensive")
    x = rows(sure)
    got = await infer(client, "cascade_all", x)
    np.testing.assert_allclose(got, 2 * x)  # the cheap model's answer
    assert await count(client, "cascade_expensive") == before  # the expensive model never ran
    unsure = rows([False, False])
    np.testing.assert_allclose(await infer(client, "cascade_all", unsure), expensive(unsure), rtol=1e-4, atol=1e-5)
    assert await count(client, "cascade_expensive") == before + 2
    for batch in (x, unsure, rows([True, False, False, True, False])):
        np.testing.assert_allclose(await infer(client, "cascade", batch), await infer(client, "cascade_bls", batch),
                                   rtol=1e-5, atol=1e-6)
    steps = step_metrics(server, "cascade_all")
    assert steps[("1", "cascade_expensive", "skipped")] == 1 and steps[("1", "cascade_expensive", "ran")] == 1
    assert steps[("0", "cascade_cheap", "ran")] == 2


async def test_per_row_predicates_split_the_batch_and_merge_it_in_order(client, server):
    sure = [True, False, True, False, False, True]
    x = rows(sure)
    before = await count(client, "cascade_expensive")
    got = await infer(client, "cascade", x)
    mask = np.array(sure)
    np.testing.assert_allclose(got[mask], 2 * x[mask])
    np.testing.assert_allclose(got[~mask], expensive(x[~mask]), rtol=1e-4, atol=1e-5)
    assert await count(client, "cascade_expensive") == before + 3  # only the unsure rows
    assert step_metrics(server, "cascade").get(("1", "cascade_expensive", "split"), 0) >= 1


async def test_a_router_over_three_models(client, server):
    x = rows([False, True])
    before = {m: await count(client, m) for m in ("to_de", "to_en", "to_fr")}
    for lang, factor in (("de", 2.0), ("en", 3.0), ("fr", 5.0), ("en", 3.0)):
        np.testing.assert_allclose(await infer(client, "router", x, lang), factor * x)
    after = {m: await count(client, m) for m in before}
    assert {m: after[m] - before[m] for m in after} == {"to_de": 2, "to_en": 4, "to_fr": 2}
    steps = step_metrics(server, "router")
    assert (steps[("0", "to_de", "ran")], steps[("0", "to_en", "ran")], steps[("0", "to_fr", "ran")]) == (1, 2, 1)
    with pytest.raises(InferenceServerException) as info:
        await infer(client, "router", x, "it")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == ("ensemble 'router' step 0 (model 'to_de'): no route for key 'it' (from LANG); "
                                    "routes: ['de', 'en', 'fr']")


def test_invalid_rules_are_refused_naming_the_step_and_tensor(server):
    with grpcclient.InferenceServerClient(server.url) as c:
        index = {m.name: m for m in c.get_model_repository_index().models}
    for name in ("cascade", "cascade_all", "router", "fast_slow"):
        assert index[name].state == "READY", (name, index[name].reason)
    reasons = {n: m.reason for n, m in index.items() if n.startswith("bad_")}
    at = "step 1 (model 'cascade_expensive')"
    assert reasons["bad_tensor"].startswith(
        f"ensemble 'bad_tensor' {at}: predicate 'max(CONFIDENCE) < 0.8' reads tensor 'CONFIDENCE', which is neither "
        "an ensemble input nor produced by any step")
    assert reasons["bad_type"] == (
        f"ensemble 'bad_type' {at}: predicate 'SCORE == \"sure\"' compares tensor 'SCORE' (step 0 (model "
        "'cascade_cheap') output 'SCORE', TYPE_FP32) with a string; compare it with a number")
    assert reasons["bad_shape"].startswith(
        f"ensemble 'bad_shape' {at}: predicate 'cheap_out < 0.8' reads tensor 'cheap_out' (step 0 (model "
        f"'cascade_cheap') output 'OUTPUT0') as one value, but it has shape [{D}]; reduce it")
    assert reasons["bad_branch"] == (
        f"ensemble 'bad_branch' {at}: when the predicate 'max(SCORE) < 0.8' does not hold, no branch writes "
        "tensor(s) ['OUTPUT0']: give each a fallback in 'otherwise' (e.g. 'OUTPUT0=<an earlier tensor>')")
    assert reasons["bad_syntax"].startswith(f"ensemble 'bad_syntax' {at}: predicate 'SCORE is low' is not a comparison")
    assert reasons["bad_fallback"] == (
        f"ensemble 'bad_fallback': tensor 'SCORE': shape [{D}] of {at} output 'OUTPUT0' (otherwise 'OUTPUT0=SCORE') "
        "does not match shape [1] of step 0 (model 'cascade_cheap') output 'SCORE' (without the batch dimension)")
    assert reasons["bad_route"] == ("ensemble 'bad_route' step 0 (model 'narrow'): the ensemble's max_batch_size 8 "
                                    "is larger than model 'narrow' allows (max_batch_size 1)")


async def test_max_inflight_requests_bounds_the_slow_step(client, server, gates):
    """Twenty requests through a fast step into a held slow one: at most LIMIT are ever inside the
    slow step (queued or executing), LIMIT more wait before it with their intermediate tensor, and
    the other sixteen wait before the fast step, holding only their inputs; so neither the slow
    step's queue nor the tensors between the steps grow with the fast step's rate (Triton's
    unbounded growth, server #8458). Then every one of them is answered."""
    before = await count(client, "to_de")
    calls = [asyncio.ensure_future(infer(client, "fast_slow", rows([True]))) for _ in range(20)]
    await wait_started_async(gates / "slow")

    async def inflight(model: str) -> float:
        def scrape() -> str:
            with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
                return r.read().decode()
        text = await asyncio.to_thread(scrape)
        m = re.search(rf'^inferd_inference_inflight_request_count\{{model="{model}",version="1"\}} (\S+)$', text, re.M)
        assert m, model
        return float(m.group(1))

    for _ in range(6000):  # a bound on a hang (60 s), not a timing claim
        if await inflight("fast_slow") == 20 and await count(client, "to_de") - before >= 2 * LIMIT:
            break
        await asyncio.sleep(0.01)
    assert await inflight("fast_slow") == 20  # the server holds all twenty
    assert await count(client, "to_de") - before == 2 * LIMIT  # ... but only 2 * LIMIT passed the fast step
    assert await inflight("slow") == LIMIT
    release(gates / "slow")
    results = await asyncio.gather(*calls)
    np.testing.assert_allclose(results[0], 2 * rows([True]))
    assert await count(client, "to_de") - before == 20


async def test_a_full_step_queue_fails_the_ensemble_request_at_once(client, server, gates):
    held = asyncio.ensure_future(infer(client, "narrow", rows([True])))
    await wait_started_async(gates / "narrow")
    queued = asyncio.ensure_future(infer(client, "narrow", rows([True])))
    await wait_pending_async(server.metrics_url, "narrow", 1)  # its one queue place is taken
    with pytest.raises(InferenceServerException) as info:
        await infer(client, "to_narrow", rows([True]))
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert info.value.message().startswith("ensemble 'to_narrow' step 1 (model 'narrow'): ")
    release(gates / "narrow")
    await asyncio.gather(held, queued)


# -- the scheduler's decisions, with fake models ----------------------------------------------


def two_steps():  # type: ignore[no-untyped-def]
    """a: INPUT0 -> x; b (conditional): x -> OUTPUT0, fallback INPUT0."""
    return [("a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "x"}), ("b", {"INPUT0": "x"}, {"OUTPUT0": "OUTPUT0"})]


def doubling():  # type: ignore[no-untyped-def]
    async def fn(request):  # type: ignore[no-untyped-def]
        return {"OUTPUT0": request.inputs["INPUT0"] * 2}
    return fn


async def test_split_rows_run_in_one_request_and_merge_in_order():
    a, b = fake_model("a", identity_fn()), fake_model("b", doubling())
    sched, stats = make_ensemble({"a": a, "b": b}, two_steps(), rules={
        "inferd.step.1.when_row": "max(x) > 0", "inferd.step.1.otherwise": "OUTPUT0=INPUT0"})
    x = np.array([[1, 1, 1, 1], [-1, -1, -1, -1], [2, 2, 2, 2]], np.float32)
    out = await sched.infer(request(x), 3)
    assert out["OUTPUT0"].tolist() == [[2] * 4, [-1] * 4, [4] * 4]
    assert b.scheduler.calls[0].inputs["INPUT0"].tolist() == [[1] * 4, [2] * 4]  # only the rows that hold
    await sched.infer(request(-x[:1]), 1)  # no row holds: b is skipped
    one = x[:1]
    await sched.infer(request(one), 1)  # every row holds: b runs the request as it is, not copied
    assert len(b.scheduler.calls) == 2 and b.scheduler.calls[1].inputs["INPUT0"] is one
    assert stats.steps == {(0, "a", "ran"): 3, (1, "b", "split"): 1, (1, "b", "skipped"): 1, (1, "b", "ran"): 1}


async def test_a_skipped_step_is_traced_as_skipped():
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inferd.observability.tracing import TraceConfig, Tracing

    exporter = InMemorySpanExporter()
    tracing = Tracing(TraceConfig(level=("TIMESTAMPS",), rate=1), processor=SimpleSpanProcessor(exporter))
    a, b = fake_model("a", identity_fn()), fake_model("b", doubling())
    sched, _ = make_ensemble({"a": a, "b": b}, two_steps(), rules={
        "inferd.step.1.when": "min(x) > 0", "inferd.step.1.otherwise": "OUTPUT0=INPUT0"})
    trace = tracing.start("ens")
    x = -np.ones((1, 4), np.float32)
    out = await sched.infer(request(x, trace=trace), 1)
    trace.end()
    assert out["OUTPUT0"] is x and not b.scheduler.calls
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["ensemble step 0 a"].attributes["inferd.step.outcome"] == "ran"
    assert spans["ensemble step 1 b"].attributes["inferd.step.outcome"] == "skipped"
    tracing.shutdown()


async def test_a_route_by_request_parameter_and_a_missing_one():
    a, b = fake_model("a", identity_fn()), fake_model("b", doubling())
    sched, stats = make_ensemble({"a": a, "b": b}, [("a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})], rules={
        "inferd.step.0.route_by": "parameter:variant", "inferd.step.0.route": "plain=a,*=b"})
    x = np.ones((1, 4), np.float32)
    assert (await sched.infer(request(x, parameters={"variant": "plain"}), 1))["OUTPUT0"].tolist() == [[1] * 4]
    assert (await sched.infer(request(x, parameters={"variant": "other"}), 1))["OUTPUT0"].tolist() == [[2] * 4]
    from inferd.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as info:
        await sched.infer(request(x), 1)
    assert info.value.message == ("ensemble 'ens' step 0 (model 'a'): the step is routed by request parameter "
                                  "'variant', which the request does not carry (keys: ['plain', '*'])")
    assert stats.steps == {(0, "a", "ran"): 1, (0, "b", "ran"): 1}
