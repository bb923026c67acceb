"""run_lines and BatchJobs over a fake infer: resume, retries, cancellation, restarts."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from inferd.batchjobs import (
    CANCELLED, COMPLETED, RUNNING, BatchJobs, JsonlResults, Line, Result, parse_lines, read_jsonl, run_lines,
)
from inferd.clock import FakeClock
from inferd.errors import InvalidArgument, NotFound, Unavailable

WAIT = 10.0


def jsonl(n: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"id-{i}", "inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1], "data": [float(i)]}]}) + "\n" for i in range(n)).encode()


class FakeModel:
    """Doubles X; ``gate`` (when set) holds each call until the test releases it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.running = 0
        self.most = 0
        self.gate: asyncio.Semaphore | None = None
        self.fail: dict[str, BaseException] = {}

    async def __call__(self, line: Line) -> tuple[str, dict[str, np.ndarray]]:
        self.calls.append(line.custom_id)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if self.gate is not None:
                await self.gate.acquire()
            else:
                await asyncio.sleep(0)  # others start meanwhile
            error = self.fail.pop(line.custom_id, None)
            if error is not None:
                raise error
            x = np.asarray(line.body["inputs"][0]["data"], dtype=np.float32)
            return "1", {"Y": x * 2}
        finally:
            self.running -= 1


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_every_line_gets_its_result_with_at_most_window_in_flight(tmp_path):
    model = FakeModel()
    writer = JsonlResults(tmp_path / "r.jsonl")
    seen: list[str] = []
    progress = await run_lines(parse_lines(jsonl(20)), writer, model, window=3, on_result=lambda r: seen.append(r.custom_id))
    writer.close()
    assert progress.succeeded == 20 and model.most == 3
    results = {r.custom_id: r for r in read_jsonl(tmp_path / "r.jsonl")}
    assert sorted(results) == sorted(seen) == sorted(f"id-{i}" for i in range(20))
    assert float(results["id-7"].outputs["Y"][0]) == 14.0


async def test_a_second_run_does_only_the_lines_without_a_result(tmp_path):
    model = FakeModel()
    lines = parse_lines(jsonl(5))
    writer = JsonlResults(tmp_path / "r.jsonl")
    writer.write(Result("id-1", outputs={"Y": np.zeros(1)}))
    writer.write(Result("id-3", error="earlier"))
    await run_lines(lines, writer, model)
    writer.close()
    assert sorted(model.calls) == ["id-0", "id-2", "id-4"]
    assert len(list(read_jsonl(tmp_path / "r.jsonl"))) == 5


async def test_errors_are_results_and_unavailable_is_retried(tmp_path):
    model = FakeModel()
    model.fail = {"id-0": InvalidArgument("model 'm': input 'X' is wrong"), "id-1": Unavailable("loading")}
    clock = FakeClock()
    writer = JsonlResults(tmp_path / "r.jsonl")
    run = asyncio.ensure_future(run_lines(parse_lines(jsonl(2)), writer, model, clock=clock))
    await settle()
    assert not run.done() and model.calls.count("id-1") == 1
    clock.advance(0.5)  # the first retry delay
    progress = await asyncio.wait_for(run, WAIT)
    writer.close()
    assert model.calls.count("id-1") == 2 and progress.retries == 1
    results = {r.custom_id: r for r in read_jsonl(tmp_path / "r.jsonl")}
    assert results["id-0"].error == "model 'm': input 'X' is wrong" and results["id-0"].error_type == "InvalidArgument"
    assert results["id-1"].ok


async def test_a_job_completes_and_its_results_are_read_back(tmp_path):
    jobs = BatchJobs(tmp_path / "batches", lambda model, version, line: FakeModel()(line))
    await jobs.start()
    info = await jobs.submit(jsonl(4), "m")
    done = await asyncio.wait_for(jobs.wait(info.id), WAIT)
    assert done.status == COMPLETED and done.succeeded == 4 and done.document()["request_counts"] == {
        "total": 4, "completed": 4, "succeeded": 4, "failed": 0}
    assert sorted(r.custom_id for r in jobs.results(info.id)) == [f"id-{i}" for i in range(4)]
    assert [j.id for j in jobs.all()] == [info.id]
    with pytest.raises(NotFound):
        jobs.get("batch_nope")
    with pytest.raises(InvalidArgument):
        await jobs.submit(b"{}", "m")
    await jobs.stop()


async def test_a_stopped_server_resumes_its_jobs_and_each_id_has_one_result(tmp_path):
    root = tmp_path / "batches"
    model = FakeModel()
    model.gate = asyncio.Semaphore(0)
    jobs = BatchJobs(root, lambda m, v, line: model(line), window=4)
    await jobs.start()
    info = await jobs.submit(jsonl(10), "m")
    await settle()
    for _ in range(3):
        model.gate.release()
    await settle()
    await jobs.stop()  # 3 results written, 4 in flight abandoned
    on_disk = json.loads((root / info.id / "job.json").read_text())
    assert on_disk["status"] == RUNNING and on_disk["succeeded"] == 3

    model.gate = None
    again = BatchJobs(root, lambda m, v, line: model(line))
    await again.start()
    done = await asyncio.wait_for(again.wait(info.id), WAIT)
    assert done.status == COMPLETED and done.succeeded == 10
    ids = [r.custom_id for r in again.results(info.id)]
    assert sorted(ids) == sorted(f"id-{i}" for i in range(10)) and len(ids) == len(set(ids))
    await again.stop()


async def test_cancel_stops_a_job_and_keeps_its_results(tmp_path):
    model = FakeModel()
    model.gate = asyncio.Semaphore(0)
    jobs = BatchJobs(tmp_path, lambda m, v, line: model(line), window=2)
    await jobs.start()
    info = await jobs.submit(jsonl(6), "m")
    await settle()
    model.gate.release()
    await settle()
    cancelled = await jobs.cancel(info.id)
    assert cancelled.status == CANCELLED and cancelled.succeeded == 1
    calls = len(model.calls)
    await settle()
    assert len(model.calls) == calls  # nothing more runs
    assert (await jobs.cancel(info.id)).status == CANCELLED  # again: no change
    restarted = BatchJobs(tmp_path, lambda m, v, line: model(line))
    await restarted.start()
    assert restarted.get(info.id).status == CANCELLED and len(model.calls) == calls  # not resumed
    await jobs.stop()
