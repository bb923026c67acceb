"""The decisions behind adaptive waiting and latency SLOs: pure functions of plain data.

Each takes what the batch decision knows (the queue's head and rows, the
online estimates of :mod:`inferd.scheduling.estimates`, ``now``) and returns a
time or a size; none reads a clock or keeps state, so tests drive them with
made-up numbers. :class:`~inferd.scheduling.queue.BatchQueue` calls them.

Waiting (``inferd.batch_wait``). ``max_queue_delay_microseconds`` is the most a
request may wait for company. ``fixed`` waits all of it, as Triton does.
``adaptive`` waits only when company is expected: at least one more row within a
delay at the rate rows arrive while requests are queued (until that rate rests on
enough evidence: or someone joined the last requests that waited). So a lone
request at low load (a closed loop of one client: nobody ever joins it) runs at
once, and under load it waits out the delay as ``fixed`` does, not stopping at an
arrival because the next one seems late: there the server is short of CPU (the
event loop and the runtime share the cores), and every execution batching saves
is capacity for other requests. It does not wait either where the execution
model says batching saves nothing measurable (time proportional to rows). With
no company expected, one head request in ``PROBE_EVERY`` (``PROBE_NEAR`` when
nearly a row is expected per delay) waits anyway, as a probe, to notice when
company starts coming.

SLOs (``inferd.max_latency_microseconds``). Every request must be answered within
the budget of its arrival. A wait ends early enough for the batch to run in the
head's budget, a batch is cut to the rows that fit it, and a request whose
estimated completion (the rows queued ahead of it, at its priority and above,
run in full batches on the instances as they free up) passes its budget is
refused when it arrives, with the estimate in the message. A request finding
nothing ahead of it and an instance free is always admitted: the estimate can be
wrong (a stalled execution), and only executions correct it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from inferd.errors import DeadlineExceeded, InferdError, SloRefused, Unavailable
from inferd.scheduling.estimates import PROBE_EVERY, ArrivalRate, ExecutionModel

ADAPTIVE, FIXED = "adaptive", "fixed"
# Batching "saves nothing measurable" below this share of one execution's time.
NEGLIGIBLE = 0.02
# Nearly expected (this share of a row per delay, after a lull under load, say): probe one head in
# PROBE_NEAR rather than PROBE_EVERY, so batching comes back quickly once company does.
NEAR, PROBE_NEAR = 0.25, 4
# Executions simulated to estimate a completion before extrapolating.
MAX_SIMULATED = 256


@dataclass(frozen=True, slots=True)
class WaitPolicy:
    """How long a batch may wait for company, and the latency budget (0: none), in seconds."""

    mode: str = ADAPTIVE
    bound_s: float = 0.0
    slo_s: float = 0.0

    @property
    def slo_us(self) -> int:
        return round(self.slo_s * 1e6)


def wait_until(policy: WaitPolicy, head_arrival: float, head_seq: int, rows: int, now: float,
               rate: ArrivalRate, model: ExecutionModel) -> float | None:
    """When to look again at a batch of ``rows`` rows that could still grow (None: run it now)."""
    deadline = head_arrival + policy.bound_s
    if policy.slo_s:
        deadline = min(deadline, head_arrival + policy.slo_s - model.upper(rows + 1))
    if now >= deadline:
        return None
    if policy.mode == FIXED:
        return deadline
    if model.settled:
        fixed = model.fixed_cost()
        if fixed is not None and fixed <= NEGLIGIBLE * model.predict(rows):
            return None  # batching would not make the execution cheaper: waiting only adds latency
    expected = rate.rate(now) * policy.bound_s  # rows expected within one delay
    if expected >= 1.0 or (rate.company_last_time and not rate.informed):
        return deadline  # company is expected within a delay: wait it out, as fixed does
    if head_seq % (PROBE_NEAR if expected >= NEAR else PROBE_EVERY) == 0:
        return deadline  # a probe: waits, to notice when company starts (or comes back after a lull)
    return None


def slo_rows(policy: WaitPolicy, head_arrival: float, now: float, rows: Sequence[int],
             model: ExecutionModel) -> int:
    """How many of a batch's requests (``rows``: each one's rows, in order) to run so that
    the batch ends within the head's budget; at least the head."""
    if not policy.slo_s:
        return len(rows)
    budget = head_arrival + policy.slo_s - now
    total = sum(rows)
    count = len(rows)
    while count > 1 and model.upper(total) > budget:
        count -= 1
        total -= rows[count]
    return count


@dataclass(frozen=True, slots=True)
class Instance:
    """An instance as admission sees it: when it is expected to be free, and its execution model."""

    free_at: float
    model: ExecutionModel


def completion(now: float, rows_ahead: int, rows: int, max_rows: int, instances: Sequence[Instance],
               expected: bool = False) -> float:
    """When a request of ``rows`` rows, queued behind ``rows_ahead`` rows, is expected to be
    answered: the rows run in full batches, in order, each on the instance that frees first.
    Each batch takes its upper estimate (a budget's view), or its expected time (``expected``)."""
    return _simulate(now, rows_ahead + rows, max_rows, instances, expected)[1]


def start(now: float, rows_ahead: int, max_rows: int, instances: Sequence[Instance]) -> float:
    """When a request queued behind ``rows_ahead`` rows is expected to be taken by an instance: the
    rows ahead run in full batches at their expected times, then the first instance free takes it."""
    return _simulate(now, rows_ahead, max_rows, instances, True)[0]


def _simulate(now: float, rows: int, max_rows: int, instances: Sequence[Instance],
              expected: bool) -> tuple[float, float]:
    """``rows`` rows run in full batches, each on the instance that frees first: (when an instance is
    next free after the last of them is taken, when the last of them is done)."""
    if not instances:
        return now, now
    free = [max(i.free_at, now) for i in instances]
    remaining = rows
    done = now
    for _ in range(MAX_SIMULATED):
        if remaining <= 0:
            return min(free), done
        k = min(range(len(free)), key=free.__getitem__)
        batch = min(max_rows, remaining)
        model = instances[k].model
        free[k] += model.predict(batch) if expected else model.upper(batch)
        done = free[k]
        remaining -= batch
    # A very long queue: the rest at the pace of the simulated batches.
    per_row = (done - now) / max(1, rows - remaining)
    return min(free) + per_row * remaining, done + per_row * remaining


def deadline_refusal(model: str, now: float, deadline: float | None, start_by: float | None, rows_ahead: int,
                     rows: int, max_rows: int, instances: Sequence[Instance]) -> InferdError | None:
    """The refusal of a request that cannot be answered in time, or None to admit it: its client's
    ``deadline`` (absolute) has passed, or its queue timeout (``start_by``: when it must have been taken by an
    instance) has; or, with ``rows_ahead`` rows queued ahead of it on ``instances``, even the expected
    execution times (not the upper ones an SLO plans with: refusing is the harsher error) take it past
    either. Running such a request would answer nobody (issue 42). A request finding nothing ahead of it
    and an instance free is admitted whatever the estimates say."""
    if deadline is not None and deadline <= now:
        return DeadlineExceeded(f"model '{model}': the request's deadline passed {round((now - deadline) * 1e6)} us "
                                "before it reached the model's queue; it was not run")
    if start_by is not None and start_by <= now:
        return Unavailable(f"model '{model}': request timed out before it reached the model's queue: its queue "
                           f"timeout passed {round((now - start_by) * 1e6)} us ago; it was not run")
    if not instances or (rows_ahead == 0 and any(i.free_at <= now for i in instances)):
        return None
    # Most requests have time to spare (a client's deadline of seconds): settled without simulating.
    if (deadline is None or deadline >= _latest(now, rows_ahead + rows, max_rows, instances)) and \
            (start_by is None or start_by >= _latest(now, rows_ahead, max_rows, instances)):
        return None
    if start_by is not None:
        taken = start(now, rows_ahead, max_rows, instances)
        if taken > start_by:
            return Unavailable(
                f"model '{model}': request refused: it cannot start within its queue timeout: estimated "
                f"{round((taken - now) * 1e6)} us until an instance takes it, {round((start_by - now) * 1e6)} us "
                f"left ({_ahead(rows_ahead, rows, max_rows, instances)}); retry later")
    if deadline is not None:
        done = completion(now, rows_ahead, rows, max_rows, instances, expected=True)
        if done > deadline:
            return Unavailable(
                f"model '{model}': request refused: its deadline cannot be met: estimated "
                f"{round((done - now) * 1e6)} us to answer it, {round((deadline - now) * 1e6)} us left "
                f"({_ahead(rows_ahead, rows, max_rows, instances)}); retry later or elsewhere")
    return None


def _latest(now: float, rows: int, max_rows: int, instances: Sequence[Instance]) -> float:
    """A time the simulation of ``rows`` rows never passes: every instance's current execution done,
    then every batch run one after another at the slowest instance's expected time for a batch."""
    batches = -(-rows // max(1, max_rows))
    slowest = max(max(i.model.predict(1), i.model.predict(max(1, max_rows))) for i in instances)
    return max(now, *(i.free_at for i in instances)) + batches * slowest


def _ahead(rows_ahead: int, rows: int, max_rows: int, instances: Sequence[Instance]) -> str:
    batch = min(max_rows, rows_ahead + rows)
    per_batch = min(i.model.predict(batch) for i in instances)
    return (f"{rows_ahead} rows queued ahead of it, about {round(per_batch * 1e6)} us per batch of {batch} rows "
            f"on {len(instances)} instance{'s' if len(instances) != 1 else ''}")


def admission(policy: WaitPolicy, model: str, now: float, rows_ahead: int, rows: int, max_rows: int,
              instances: Sequence[Instance], waited: float = 0.0) -> SloRefused | None:
    """The refusal of a request whose estimated completion passes its budget, or None to admit it.
    ``waited``: seconds since its frontend received it (spent from the budget already)."""
    if not policy.slo_s:
        return None
    if rows_ahead == 0 and any(i.free_at <= now for i in instances):
        return None  # nothing ahead of it and an instance free: it runs at once, whatever the estimate says
    done = completion(now, rows_ahead, rows, max_rows, instances)
    if done - now + waited <= policy.slo_s:
        return None
    batch = min(max_rows, rows_ahead + rows)
    per_batch = min(i.model.upper(batch) for i in instances)
    return SloRefused(
        f"model '{model}': request refused: it cannot meet the latency SLO of {policy.slo_us} us "
        f"(inferd.max_latency_microseconds): estimated {round((done - now + waited) * 1e6)} us to answer it "
        f"({round(waited * 1e6)} us waited since its frontend received it, {rows_ahead} rows queued ahead of "
        f"it, about {round(per_batch * 1e6)} us per batch of {batch} rows "
        f"on {len(instances)} instance{'s' if len(instances) != 1 else ''}); retry later or with another priority")
