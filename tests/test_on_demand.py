"""``--model-control-mode on_demand`` through tritonclient: 30 table models whose footprints add up to
about 3x ``--model-memory-budget``, a Zipf-distributed stream over them, a pinned model, one larger
than the budget, a model whose load the test holds (concurrent first requests share one load), an
ensemble whose steps get evicted. One server for the module (both process modes: `make test`)."""

from __future__ import annotations

import re
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).parent))
from conftest import ServerProcess, running  # noqa: E402
from gated_model import add_gated_model, release  # noqa: E402

from inferd.examples.many_models import add_table_model, build_many, expected, pinned  # noqa: E402
from inferd.repository.footprint import rss_bytes  # noqa: E402

MiB = 2**20
FLOATS = 400_000  # 1.6 MB of table per model
BUDGET = 32 * MiB  # ~12 of the table models (2.7 MiB each, as their loads measure them)
# RSS past (start-up + budget) the allocator may keep: freed pages it has not returned yet. Small enough
# that the bound fails if nothing is evicted (the 30 models hold ~80 MiB: checked below); measured here
# the peak stayed 28 MiB above the baseline.
MARGIN = 16 * MiB
COUNT = 30


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("on_demand")
    build_many(root, COUNT, FLOATS)
    add_table_model(root, "pinned", 90, FLOATS, extra=pinned())
    add_table_model(root, "huge", 91, BUDGET // 4 + MiB)  # its file alone is larger than the budget
    add_gated_model(root, "held", root.parent / (root.name + "-gate"), hold_load=True, dims=(1,))
    (root / "ens" / "1").mkdir(parents=True)
    (root / "ens" / "config.pbtxt").write_text(
        'name: "ens"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        'input [ { name: "I" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        'output [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling {\n'
        '  step { model_name: "m28" model_version: -1 input_map { key: "I" value: "I" } output_map { key: "Y" value: "A" } }\n'
        '  step { model_name: "m29" model_version: -1 input_map { key: "I" value: "I" } output_map { key: "Y" value: "B" } }\n'
        '}\n')
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with running(repo, extra_args=["--model-control-mode", "on_demand", "--model-memory-budget",
                                   str(BUDGET)]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


def ask(client: grpcclient.InferenceServerClient, model: str, i: int) -> float:
    x = grpcclient.InferInput("I", [1], "INT64")
    x.set_data_from_numpy(np.array([i], dtype=np.int64))
    return float(client.infer(model, [x], client_timeout=120).as_numpy("Y")[0])


def scrape(server: ServerProcess) -> dict[tuple[str, str], float]:
    """(family, model label or "") -> value, for the inferd_model_* families."""
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for m in re.finditer(r'^(inferd_model_\w+?)(?:\{model="([^"]*)"\})? (\S+)$', text, re.MULTILINE):
        out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def states(client: grpcclient.InferenceServerClient) -> dict[str, str]:
    return {m.name: m.state for m in client.get_model_repository_index().models}


def test_every_model_is_listed_and_only_the_pinned_one_is_loaded(server: ServerProcess, client) -> None:  # type: ignore[no-untyped-def]
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert set(index) == {f"m{i:02d}" for i in range(COUNT)} | {"pinned", "huge", "held", "ens"}
    assert index["pinned"].state == "READY"
    assert index["m00"].state == "UNAVAILABLE" and "loads on its first request" in index["m00"].reason
    assert client.is_server_ready()


def test_zipf_stream_answers_everything_within_the_budget(server: ServerProcess, client) -> None:  # type: ignore[no-untyped-def]
    assert ask(client, "m00", 1) == expected(0, 1)  # the runtime's one-time set-up is in the baseline
    baseline = rss_bytes(server.proc.pid)
    rng = np.random.default_rng(28)
    p = 1.0 / np.arange(1, COUNT + 1) ** 1.1
    stream = rng.choice(COUNT, size=240, p=p / p.sum())
    stream[:COUNT] = rng.permutation(COUNT)  # every model at least once: their footprints are all measured
    peak = [baseline]
    errors: list[str] = []
    lock = threading.Lock()

    def one(k: int, model: int) -> None:
        try:
            got = ask(client, f"m{model:02d}", k)
            if got != expected(model, k):
                errors.append(f"m{model:02d}[{k}] = {got}")
        except InferenceServerException as exc:
            errors.append(f"m{model:02d}: {exc}")
        with lock:
            peak[0] = max(peak[0], rss_bytes(server.proc.pid))

    with ThreadPoolExecutor(4) as pool:  # at most 4 models busy: there is always an idle one to evict
        list(pool.map(one, range(len(stream)), stream))
    assert errors == []
    metrics = scrape(server)
    footprints = sum(metrics[("inferd_model_footprint_bytes", f"m{i:02d}")] for i in range(COUNT))
    assert footprints >= 2.4 * BUDGET, footprints / MiB  # the models together would not fit (about 3x)
    assert footprints > BUDGET + MARGIN + 16 * MiB  # so the RSS bound below fails if nothing is evicted
    assert metrics[("inferd_model_memory_used_bytes", "")] <= BUDGET
    evictions = sum(metrics.get(("inferd_model_evictions_total", f"m{i:02d}"), 0) for i in range(COUNT))
    hits = sum(metrics.get(("inferd_model_residency_hits_total", f"m{i:02d}"), 0) for i in range(COUNT))
    assert evictions > 0 and hits > 0
    print(f"footprints {footprints / MiB:.0f} MiB over {COUNT} models, budget {BUDGET / MiB:.0f} MiB; "
          f"RSS baseline {baseline / MiB:.0f} MiB, peak {peak[0] / MiB:.0f} MiB; {evictions:.0f} evictions")
    assert peak[0] <= baseline + BUDGET + MARGIN, (peak[0] - baseline) / MiB
    # The pinned model never left; ModelStatistics reports a loaded model's footprint.
    assert metrics.get(("inferd_model_evictions_total", "pinned"), 0) == 0
    assert states(client)["pinned"] == "READY"
    stats = client.get_inference_statistics("pinned").model_stats[0]
    assert [u.type for u in stats.memory_usage] == ["CPU"] and stats.memory_usage[0].byte_size > 0


def test_a_model_larger_than_the_budget_is_refused_resource_exhausted(server: ServerProcess, client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as info:
        ask(client, "huge", 0)
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    message = info.value.message()
    assert "model 'huge' needs" in message and f"more than the whole model memory budget of {BUDGET / MiB:.1f} MiB" in message
    assert ask(client, "m03", 2) == expected(3, 2)  # the server goes on


def test_concurrent_first_requests_share_one_load(server: ServerProcess, client, repo: Path) -> None:  # type: ignore[no-untyped-def]
    gate = repo.parent / (repo.name + "-gate")
    results: list[object] = []

    def one(value: float) -> None:
        c = grpcclient.InferenceServerClient(server.url)
        try:
            x = grpcclient.InferInput("INPUT0", [1], "FP32")
            x.set_data_from_numpy(np.array([value], dtype=np.float32))
            results.append(float(c.infer("held", [x], client_timeout=120).as_numpy("OUTPUT0")[0]))
        except InferenceServerException as exc:
            results.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(float(v),)) for v in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while scrape(server).get(("inferd_model_residency_misses_total", "held"), 0) < 4:  # all four wait
        assert time.monotonic() < deadline, "the four requests did not reach the cold model"
        time.sleep(0.02)
    release(gate, "loaded")
    release(gate)
    for t in threads:
        t.join(120)
    assert sorted(results) == [0.0, 1.0, 2.0, 3.0]  # type: ignore[type-var]
    assert scrape(server)[("inferd_model_loads_total", "held")] == 1


def test_an_ensemble_whose_steps_were_evicted_still_answers(server: ServerProcess, client) -> None:  # type: ignore[no-untyped-def]
    def run() -> tuple[float, float]:
        x = grpcclient.InferInput("I", [1], "INT64")
        x.set_data_from_numpy(np.array([7], dtype=np.int64))
        r = client.infer("ens", [x], client_timeout=120)
        return float(r.as_numpy("A")[0]), float(r.as_numpy("B")[0])

    assert run() == (expected(28, 7), expected(29, 7))
    for i in range(28):  # 28 other models: more than the budget holds beside the pinned one
        assert ask(client, f"m{i:02d}", 7) == expected(i, 7)
    now = states(client)
    assert now["m28"] == "UNAVAILABLE" and now["m29"] == "UNAVAILABLE"
    assert run() == (expected(28, 7), expected(29, 7))
    assert states(client)["m28"] == "READY"


def test_explicit_load_pins_and_unload_unpins(server: ServerProcess, client) -> None:  # type: ignore[no-untyped-def]
    client.load_model("m27")
    for i in range(27):
        ask(client, f"m{i:02d}", 1)
    assert states(client)["m27"] == "READY"  # pinned: the stream above evicted others
    client.unload_model("m27")
    assert states(client)["m27"] == "UNAVAILABLE"
    assert ask(client, "m27", 3) == expected(27, 3)  # and it loads again on demand
