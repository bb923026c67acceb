"""The server-wide bound on queueing delay: a CoDel-style controller, as a pure decision.

A request's queueing delay is the time from its frontend receiving it
(``InferenceRequest.received_ns``, CLOCK_MONOTONIC: one clock for every process
of a host) to its scheduler handing it to an instance: the wait in gRPC, the
frontend, the hand-off, the core's read backlog and the model's queue, all of
it. A short burst is fine: a queue absorbs it and drains. A *standing* queue
is not: once even the least-delayed request over a whole ``interval`` waited
more than ``target``, the server is taking more than it can answer in time,
and every further request only waits longer (the issue's overload run: all
15,820 admitted, p99 3.2 s, none shed). That is CoDel's test (Nichols and
Jacobson), taken from packets to requests:

- :meth:`QueueDelay.observe` is told each dispatched request's delay. A delay
  below ``target`` ends any overload at once; delays above it for ``interval``
  (the minimum over the interval stays above) start one ("dropping").
- While dropping, :meth:`QueueDelay.refusal` sheds a new request whose received
  time says it has already waited longer than ``target`` (before it costs
  anything more), and :meth:`QueueDelay.shed_at` gives the admitted ones the
  time past which, still queued, they are shed too (the queue's timer). So the
  requests that are served waited at most about ``target``, and the rest are
  answered UNAVAILABLE at once, which a client retries or backs off from.
- An overload that ended less than ``REENTER_INTERVALS`` intervals ago starts
  again at the first delay above target (CoDel keeps its drop count for the
  same reason): while dropping, the requests served waited less than the
  target by construction, so the first of them ends the overload, and without
  this memory the queue would regrow for a whole interval each time.

There is one controller per model (:meth:`QueueDelay.fresh` makes each from the
server's settings), and a model's target follows its own executions
(:meth:`QueueDelay.follow`): at least the configured target, and at least
``execution_multiple`` times the model's mean execution. A model that takes 400
ms an execution queues a request or two behind the one running as a matter of
course; a fixed 50 ms target would shed it at a concurrency of two. So the
bound is on queueing relative to the model's own work (a default server keeps
a request's wait within about five of its model's executions), and one model's
overload sheds only its own requests.

Off by default (issue 42): a server cannot tell, from queueing delay alone, an
overload from a load its user chose. A closed loop of N clients (perf_analyzer
at concurrency N, a pool of N workers) keeps N requests inside the server, so
each waits behind the others about N times its share of the work (Little's
law): 128 clients of an unbatched model taking 5 ms an execution wait ~640 ms,
far past any target, and a standing queue by CoDel's test. Shedding them
answered UNAVAILABLE to a load that can never grow past 128 (perf_analyzer
stops at its first error; Triton served the same command). What makes an
overload is a queue that keeps growing, and a closed loop's cannot; so the
default bound is on what the server *holds*: the admission caps
(:mod:`inferd.dataplane.admission`), set so that a benchmark at concurrency
1,024 never reaches them, refuse the excess of a load that does grow. Waits are bounded where a
client asks for a bound: its deadline or ``timeout`` (refused at admission when
the queue ahead cannot meet it), the model's queue policy, or its latency SLO.
A server that prefers bounded waits to serving every chosen load sets
``--queue-delay-target-us`` (50,000 is the value measured in bench/RESULTS.md).

Plain data and ``now`` in, a verdict out; no clock, no loop, no lock (the data
plane calls it on the event loop). ``target`` 0 turns it off.
"""

from __future__ import annotations

from inferd.errors import Unavailable

# The target when shedding is asked for (--queue-delay-target-us; off by default, the module's last
# paragraph says why): mlp at 16 in flight, unloaded, answers with p99 25-56 ms here (2 cores shared with the
# client and other engineers' tests), its requests waiting a few ms each for the batch ahead of them but
# now and then tens of ms when the machine is busy: a 20 ms target made that normal load shed after an
# overload (bench/RESULTS.md, shedding: throughput after 0.51x before), so the target is 50 ms, twice
# that p99, and bounds the queueing the stamp sees well within 10x the unloaded p99 (what waits before
# the stamp, in gRPC core's and the kernel's queues or the client, it cannot see: measured so). 100 ms is
# CoDel's own interval: a burst that drains within it is never shed. The memory of a past overload is
# two intervals: long enough to stop the queue regrowing for an interval each time shedding pauses,
# short enough that the normal load after an overload is not shed for its noise.
SUGGESTED_TARGET_US = 50_000
DEFAULT_TARGET_US = 0  # off: a closed loop of clients is a load the user chose
DEFAULT_EXECUTION_MULTIPLE = 5.0
DEFAULT_INTERVAL_US = 100_000
REENTER_INTERVALS = 2
FLAGS = ("--queue-delay-target-us, --queue-delay-interval-us, --queue-delay-execution-multiple; "
         "--queue-delay-target-us 0 or --no-shed turns shedding off")


class QueueDelay:
    """The controller's state: one per server, fed by the data plane on the event loop."""

    __slots__ = ("base_s", "execution_multiple", "target_s", "interval_s", "above_since", "dropping", "left_at",
                 "shed", "last_delay")

    def __init__(self, target_us: int = DEFAULT_TARGET_US, interval_us: int = DEFAULT_INTERVAL_US,
                 execution_multiple: float = DEFAULT_EXECUTION_MULTIPLE) -> None:
        if target_us < 0:
            raise ValueError(f"--queue-delay-target-us must be >= 0 (0: off), got {target_us}")
        if interval_us < 1:
            raise ValueError(f"--queue-delay-interval-us must be >= 1, got {interval_us}")
        if execution_multiple < 0:
            raise ValueError(f"--queue-delay-execution-multiple must be >= 0 (0: the target alone), "
                             f"got {execution_multiple:g}")
        self.base_s = target_us / 1e6  # the configured target: the least any model gets
        self.execution_multiple = execution_multiple
        self.target_s = self.base_s
        self.interval_s = interval_us / 1e6
        self.above_since: float | None = None  # delays have stayed above target since then
        self.dropping = False
        self.left_at: float | None = None  # when the last overload ended
        self.shed = 0  # requests refused by refusal(), since start
        self.last_delay = 0.0  # the last delay observed and not settled (seconds), for the messages

    @property
    def enabled(self) -> bool:
        return self.base_s > 0

    def fresh(self) -> "QueueDelay":
        """A new controller with these settings (one per model)."""
        return QueueDelay(round(self.base_s * 1e6), round(self.interval_s * 1e6), self.execution_multiple)

    def follow(self, execution_s: float) -> None:
        """The model's mean execution is ``execution_s`` seconds: its target is at least that many
        times the multiple (and never below the configured target)."""
        self.target_s = max(self.base_s, self.execution_multiple * execution_s)

    def settled(self, delay: float) -> bool:
        """Whether observing ``delay`` would leave the decision as it is: below the configured target
        (so below the model's, which is never lower), with no overload started or building. The
        data plane then neither follows the executions nor observes it (on nearly every request):
        ``target_s`` and ``last_delay`` are current whenever an overload can start or is on, the
        only times they are read."""
        return delay < self.base_s and self.above_since is None and not self.dropping

    def observe(self, delay: float, now: float) -> None:
        """A request was handed to an instance ``delay`` seconds after its frontend received it
        (called as it ends, at ``now``)."""
        if not self.base_s:
            return
        self.last_delay = delay
        if delay < self.target_s:
            self.above_since = None
            if self.dropping:
                self.dropping = False
                self.left_at = now
            return
        if self.dropping:
            return
        if self.above_since is None:
            self.above_since = now
        if starts_overload(self.above_since, now, self.interval_s, self.left_at):
            self.dropping = True

    def refusal(self, model: str, waited: float, now: float) -> Unavailable | None:
        """The UNAVAILABLE that sheds a new request which has waited ``waited`` seconds since its
        frontend received it, or None to admit it."""
        if not self.dropping or waited <= self.target_s:
            return None
        self.shed += 1
        return Unavailable(
            f"model '{model}': request shed: the server is overloaded: the request waited "
            f"{round(waited * 1e6)} us since its frontend received it, past the model's queue-delay target of "
            f"{round(self.target_s * 1e6)} us that its requests have not met for "
            f"{round(self.interval_s * 1e6)} us or more (last queueing delay {round(self.last_delay * 1e6)} us; "
            f"{FLAGS}); retry later")

    def shed_at(self, received: float) -> float | None:
        """The time past which a request received at ``received`` and still queued is shed
        (the queue's timer), or None: not overloaded, no bound."""
        return received + self.target_s if self.dropping else None


def starts_overload(above_since: float, now: float, interval: float, left_at: float | None) -> bool:
    """Whether delays above target since ``above_since`` start an overload at ``now``: they lasted an
    interval, or an overload ended recently (within REENTER_INTERVALS intervals of ``now``)."""
    if now - above_since >= interval:
        return True
    return left_at is not None and now - left_at < REENTER_INTERVALS * interval
