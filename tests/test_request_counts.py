"""The one-process request path's Python work, pinned: calls of inferd's own code per request.

bench/request_counts.py drives the real gRPC servicer's ModelInfer over a real DataPlane
(identity_fp32, dynamic_batching {}) with protobuf requests and no sockets, and counts, through
``sys.setprofile``, the calls whose code is inferd's. The count is exact for one path and input
(no clock, no machine load in it), so a change that adds work to every request fails here, and one
that removes work lowers the pin; the ensemble_mlp ensemble (issue 30) is pinned the same way. The
pins are the counts when issue 32's and 30's cuts were made, with a margin of 10% for small honest
additions; raise one only with the reason in the commit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import request_counts

# inferd's own Python calls per request (issue 32): c=1 takes the idle fast path (one request run
# inline), c=16 queues 16 requests started in one loop turn into one batch. Before the cuts: 87
# and 85 (counted the same way, on the code of commit 170d87d); 62 and 67.4 before the second
# round's (on commit 492c231's code). 51 and 55.4 before every scheduler took one entry (issue 45): the
# awaiting path is now the callback path awaited (DataPlane.infer over submit), whose end costs a call
# more at each of three places (the data plane's release, the waiting future's wake, the lane's
# last-interactive hook), against the twins' coroutines it replaced; the hand-off path lost 13.
PINNED = {1: 55.0, 16: 57.5}
# The same for ensemble_mlp (issue 30: scale -> mlp -> relu, each step through its model's path), its
# composing models forced to execute inline so that no measured time decides the count. Before the
# cuts (commit 492c231's code, counted the same way): 195 and 226.3. 154 and 176.3 before the one
# scheduler entry (issue 45): the ensemble runs in a task of its own in this mode too (as it already did
# behind the hand-off), and each step's end costs the calls above.
PINNED_ENSEMBLE = {1: 177.0, 16: 57.5}
# c=16 was 183.5 until requests arriving together went through the steps as one request
# (inferd/ensemble/grouping.py): each step's path is paid per group. Here all sixteen arrive in one
# loop turn and go as one group; 95.1 while the first three of each sixteen went alone (the window:
# one per step's instance) and thirteen as one group, 70.2 closing a group as soon as the one before
# it passed its first step. c=1 paid 170 before grouping, 174 while a lone request took its own path.
# A ModelStreamInfer stream's requests for a model that is not decoupled (every request on one stream,
# answered in turn), counted as every Python call (inferd's and the asyncio and contextlib code it runs):
# each request now takes the unary call's path. Before (four async generators, each closed by aclosing,
# between the stream and the model): 249 and 195.1; 222 and 165.1 while each request's end was a sentinel
# of its own through the stream's outbox.
PINNED_STREAM = {1: 212.0, 16: 155.1}
MARGIN = 1.10
REQUESTS = 480  # enough that the loop's and the runtime's few constant blocks stay far below one per request
INLINE = '\nparameters { key: "inferd.execution" value { string_value: "inline" } }\n'


def _counted(repo: Path, path: str, levels: dict[int, float],
             model: str = request_counts.MODEL) -> dict[int, dict[str, float]]:
    """bench.request_counts' counts through ``path``'s servicer over ``repo``, at each concurrency of ``levels``."""

    async def measure() -> dict[int, dict[str, float]]:
        calls, close = await request_counts.servicers(repo)
        try:
            return {c: await request_counts.count(calls[path], REQUESTS, c, model) for c in levels}
        finally:
            await close()

    return asyncio.run(measure())


@pytest.fixture(scope="module")
def counts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, float]]:
    return _counted(request_counts.repository(tmp_path_factory.mktemp("counts") / "repo"), "inferd", PINNED)


@pytest.fixture(scope="module")
def ensemble_counts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, float]]:
    repo = request_counts.repository(tmp_path_factory.mktemp("ensemble") / "repo", ensemble=True)
    for step in ("ens_scale", "ens_mlp", "ens_relu"):
        with (repo / step / "config.pbtxt").open("a") as f:
            f.write(INLINE)
    return _counted(repo, "ensemble", PINNED_ENSEMBLE, request_counts.ENSEMBLE)


@pytest.fixture(scope="module")
def stream_counts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, float]]:
    return _counted(request_counts.repository(tmp_path_factory.mktemp("stream") / "repo"), "stream", PINNED_STREAM)


@pytest.mark.parametrize("concurrency", sorted(PINNED_STREAM))
def test_stream_calls_per_request_stay_pinned(stream_counts: dict[int, dict[str, float]], concurrency: int) -> None:
    got = stream_counts[concurrency]["python_calls"]
    pinned = PINNED_STREAM[concurrency]
    assert got <= pinned * MARGIN, (
        f"c={concurrency}: {got:.1f} Python calls per request on a stream, pinned at {pinned} (+10%): something "
        "now runs on every streamed request; `python -m bench.request_counts --only stream` says how many")
    assert got >= PINNED[concurrency], f"c={concurrency}: only {got:.1f}: the counter missed the stream's requests"
    assert stream_counts[concurrency]["kept_blocks"] < 0.5


@pytest.mark.parametrize("concurrency", sorted(PINNED_ENSEMBLE))
def test_ensemble_calls_per_request_stay_pinned(ensemble_counts: dict[int, dict[str, float]],
                                                concurrency: int) -> None:
    got = ensemble_counts[concurrency]["inferd_calls"]
    pinned = PINNED_ENSEMBLE[concurrency]
    assert got <= pinned * MARGIN, (
        f"c={concurrency}: {got:.1f} calls of inferd's code per ensemble_mlp request, pinned at {pinned} (+10%): "
        "something now runs on every request or step; `python -m bench.request_counts --only ensemble` says how many")
    # Alone, three steps, each through its model's path, besides the ensemble's own: far more than one
    # model's. Sixteen together share each step's path: more than one model's request still.
    floor = 2 * PINNED[concurrency] if concurrency == 1 else PINNED[concurrency]
    assert got >= floor, f"c={concurrency}: only {got:.1f}: the counter missed the steps"


@pytest.mark.parametrize("concurrency", sorted(PINNED))
def test_inferd_calls_per_request_stay_pinned(counts: dict[int, dict[str, float]], concurrency: int) -> None:
    got = counts[concurrency]["inferd_calls"]
    pinned = PINNED[concurrency]
    assert got <= pinned * MARGIN, (
        f"c={concurrency}: {got:.1f} calls of inferd's code per request, pinned at {pinned} (+10%): "
        "something now runs on every request; `python -m bench.request_counts` and cProfile say what")
    # The counter itself works: decode, validate, queue, run, shape, encode and count are all Python.
    assert got >= pinned * 0.5, f"c={concurrency}: only {got:.1f} inferd calls per request: the counter missed some"


def test_a_batch_of_16_shares_its_per_batch_work(counts: dict[int, dict[str, float]]) -> None:
    # Sixteen requests of one loop turn share one execution, so the event loop turns per request
    # fall well below the lone request's (3, the driver's task, the request, the reply).
    assert counts[16]["loop_turns"] < counts[1]["loop_turns"] / 4


def test_nothing_outlives_its_request(counts: dict[int, dict[str, float]]) -> None:
    # Blocks still allocated after a second run of the requests (compared with the first, so the
    # last batch's objects cancel out), per request: a per-request leak is >= 1.
    for c, k in counts.items():
        assert k["kept_blocks"] < 0.5, f"c={c}: {k['kept_blocks']:.2f} blocks kept per request ({k['kept_bytes']:.0f} B)"
