"""An ensemble's concurrent requests through its steps as one: grouped step requests.

Each composing model of a batching ensemble would batch its step requests anyway, concatenating
their rows into one tensor per input; every step then pays its model's path (validation, the
scheduler, shaping, statistics) and a task wake-up per request, three times over for a chain of
three. So while the steps are busy with earlier requests, the requests that arrive are gathered,
and go through the steps as one request: their inputs concatenated, each step one request of all
their rows, the ensemble's outputs split back by rows. A composing model
computes the same rows either way: only requests it would batch together are grouped (one
priority, equal input dtypes and shapes but for the batch dimension, at most the smallest
max_batch_size along the way), and only where every step's model concatenates its batches
(:meth:`~inferd.scheduling.base.Scheduler.merges_rows`). A grouped step request counts as its
members in its model's statistics (``InferenceRequest.members``), so requests, queue and compute
counts read as if each member had gone through alone.

When a group goes: as a dynamic batcher forms a batch while its instance is busy. The ensemble keeps
at most :attr:`Groups.window` groups in its steps, as many as its steps have instances (a chain of
three one-instance models: three, one per step, so each step has work while the next group gathers).
A group opens with the first request that finds none open; if the window has room, its task is
created at once, and it takes every request that joins it until that task first runs, a loop turn
later at the earliest: so all the requests that arrive in one loop turn (one socket read, one wake-up
of the front's connections) go through the steps together, and a lone request (concurrency 1) waits
for nothing but its task's start. With the window full, the open group gathers until a group ends.
A group also closes when it holds the rows of the smallest max_batch_size on the way, or when a
request cannot join it: then it goes at once, window full or not, and the request opens the next.
Measured against sending the requests that found room in the window through the steps alone, one at
a time (1.14x the throughput at concurrency 16, 0.87x the CPU per inference; concurrency 1
unchanged) and, before that, against closing a group as soon as the one before it had passed its
first step (1.11x): bench/RESULTS.md, ensemble.

Which requests are grouped (:func:`groupable`): none that carries anything that makes it differ
from its neighbours beyond its rows: a trace, a deadline or timeout, a sequence, a device tensor.
Those take the ensemble's ordinary path, one request through the steps. Requests group only with
requests of equal parameters (which every step's request carries; perf_analyzer and tritonclient's
streams send ``triton_enable_empty_final_response`` on each).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any, Callable, Coroutine

import numpy as np

from inferd.errors import ModelExecutionError
from inferd.scheduling.base import Completion, Inflight
from inferd.types import InferenceRequest

# Runs one (maybe grouped) request through the steps: (request, rows) -> its outputs.
RunGroup = Callable[[InferenceRequest, int], Coroutine[Any, Any, dict[str, np.ndarray]]]


def groupable(request: InferenceRequest) -> bool:
    """Whether ``request`` may share its steps' requests with others (see the module's doc)."""
    if (request.trace is not None or request.deadline is not None or request.timeout_us
            or request.correlation_id or request.background or request.responder is not None
            or request.output_device is not None or request.openai_prompt_tokens is not None):
        return False
    for array in request.inputs.values():  # a loop, not all(): no generator per request
        if type(array) is not np.ndarray:
            return False
    return True


def _joins(a: InferenceRequest, b: InferenceRequest) -> bool:
    """Whether ``b``'s inputs can be concatenated after ``a``'s, and the two batched together."""
    if a.priority != b.priority or a.model_version != b.model_version or a.parameters != b.parameters:
        return False
    first, other = a.inputs, b.inputs
    if first.keys() != other.keys():
        return False
    for name, x in first.items():
        y = other[name]
        if x.dtype != y.dtype or x.shape[1:] != y.shape[1:]:
            return False
    return True


class _Member:
    """One ensemble request in a group (the ``Queued`` an :class:`Inflight` answers)."""

    __slots__ = ("request", "rows", "completion", "group")

    def __init__(self, request: InferenceRequest, rows: int, completion: Completion) -> None:
        self.request = request
        self.rows = rows
        self.completion: Completion | None = completion  # None once answered or withdrawn
        self.group: _Group | None = None  # the group it joined


class _Group:
    __slots__ = ("members", "rows", "task", "started")

    def __init__(self) -> None:
        self.members: list[_Member] = []
        self.rows = 0
        self.task: asyncio.Task | None = None  # created once the window has room (or it closes)
        self.started = False  # its task has taken its members: it takes no more, and none leaves it


class Groups:
    """The gathering of one ensemble's requests into groups, and their runs through ``run``.

    ``cap`` (the most rows a group may carry; 0: no grouping) and ``window`` (groups in the steps at
    once) are set by the ensemble whenever its composing models change."""

    def __init__(self, name: str, run: RunGroup, inflight: Inflight) -> None:
        self._name = name
        self._run = run  # a group's run: its members are in flight, each answered here
        self._inflight = inflight
        self.cap = 0
        self.window = 1
        self._running = 0  # groups with a task (started, or starting at the next loop turn)
        self._open: _Group | None = None  # the group a request joins: not started yet

    def join(self, request: InferenceRequest, rows: int, completion: Completion) -> Callable[[], None]:
        """Add ``request`` (groupable, ``rows`` <= :attr:`cap`) to the open group (see the module's doc);
        it is answered through ``completion`` (in flight until then). Returns its cancel."""
        member = _Member(request, rows, completion)
        self._inflight.enter(False)
        group = self._open
        if group is not None and group.members and (
                group.rows + rows > self.cap or not _joins(group.members[0].request, request)):
            self._close(group)  # it cannot join: the group goes, and it opens the next
            group = None
        if group is None:
            group = self._open = _Group()
            if self._running < self.window:
                self._schedule(group)
        group.members.append(member)
        group.rows += rows
        member.group = group
        if group.rows >= self.cap:
            self._close(group)
        return partial(self._withdraw, member)

    def _schedule(self, group: _Group) -> None:
        """The group's task: it starts at the next loop turn, taking the members joined by then."""
        self._running += 1
        group.task = asyncio.get_running_loop().create_task(self._drive(group))

    def _close(self, group: _Group) -> None:
        """The open group takes no more requests, and goes now (window full or not)."""
        self._open = None
        if group.task is None:
            self._schedule(group)

    def _ended(self) -> None:
        """A group left the steps: the open group may go."""
        self._running -= 1
        group = self._open
        if group is not None and group.task is None:
            self._schedule(group)

    async def _drive(self, group: _Group) -> None:
        if self._open is group:
            self._open = None
        group.started = True
        members = group.members
        try:
            if not members:
                return
            if len(members) == 1:
                request, rows = members[0].request, members[0].rows
            else:
                request, rows = self._merged(members)
            outputs = await self._run(request, rows)
            answers = [outputs] if len(members) == 1 else self._split(outputs, members, rows)
        except asyncio.CancelledError:
            return  # every member withdrew: nobody to answer
        except Exception as exc:
            exc = exc.with_traceback(None)  # each member's answer: no frames kept alive with it
            for member in members:
                self._inflight.answer(member, exc)
        else:
            for member, answer in zip(members, answers):
                self._inflight.answer(member, answer)
        finally:
            group.members = []  # each member refers to its group: no cycle outlives the run
            self._ended()

    def _withdraw(self, member: _Member) -> None:
        """A member's cancel: it leaves a group that has not started (an open one left empty with no
        task is dropped); a started group all of whose members withdrew stops running through the steps."""
        if not self._inflight.withdraw(member):
            return
        group = member.group
        assert group is not None
        if not group.started:
            group.members.remove(member)
            group.rows -= member.rows
            if not group.members and group.task is None and self._open is group:
                self._open = None
        elif all(m.completion is None for m in group.members):
            assert group.task is not None
            group.task.cancel()

    @staticmethod
    def _merged(members: list[_Member]) -> tuple[InferenceRequest, int]:
        first = members[0].request
        requests = [m.request for m in members]
        inputs = {name: np.concatenate([r.inputs[name] for r in requests]) for name in first.inputs}
        merged = InferenceRequest(model_name=first.model_name, inputs=inputs, model_version=first.model_version,
                                  id=first.id, parameters=first.parameters, priority=first.priority,
                                  members=len(members))
        return merged, sum(m.rows for m in members)

    def _split(self, outputs: dict[str, np.ndarray], members: list[_Member], rows: int) -> list[dict[str, np.ndarray]]:
        """Each member's rows of the group's outputs (views: nothing is copied)."""
        for name, value in outputs.items():  # host arrays: no step of a group keeps tensors on a device
            shape = value.shape
            if shape[:1] != (rows,):
                raise ModelExecutionError(
                    f"ensemble '{self._name}': output '{name}' has shape {list(shape)}, not the {rows} rows of the "
                    f"{len(members)} requests whose steps ran together; a model whose outputs do not keep the "
                    "batch dimension's rows cannot batch")
        answers = []
        start = 0
        for member in members:
            stop = start + member.rows
            answers.append({name: value[start:stop] for name, value in outputs.items()})
            start = stop
        return answers
