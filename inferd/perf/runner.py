"""Drive the load: spawn the workers, step through the load levels, measure each level in
windows until stable (or over a fixed request count). :func:`measure` is the API: options in,
a :class:`~.results.RunResult` out; it prints progress only (the report is ``report``'s)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import resource
import sys
import time
from typing import TYPE_CHECKING

from .windows import STABILITY_WINDOWS, ClientStats, Records, is_stable, server_delta
from .inputs import ModelInfo, ServerClient, build_inputs, serialize_requests
from .options import PerfError, PerfOptions
from .results import LevelResult, RunResult
from .worker import WorkerConfig, cpu_seconds, worker_main

if TYPE_CHECKING:
    from .http import HttpServerClient

# Open loop: the rate counts as kept when the sends over the measurement are at least this share
# of what the schedule asked for (a client falling ever further behind fails it; jitter does not).
MIN_SENT_FRACTION = 0.95


# --------------------------------------------------------------------------- workers


class WorkerPool:
    """``n`` spawned worker processes, each with its own grpc.aio channel."""

    def __init__(self, n: int, config: WorkerConfig) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns = []
        self.procs = []
        self.cpu = [0.0] * n
        try:
            for i in range(n):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=worker_main, name=f"inferd-perf-worker-{i}", daemon=True,
                    args=(child, dataclasses.replace(config, index=i)),
                )
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            for i in range(n):
                self.recv(i, timeout=config.connect_timeout + 120)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.conns)

    def send(self, i: int, msg: tuple) -> None:
        try:
            self.conns[i].send(msg)
        except (BrokenPipeError, OSError):
            raise PerfError(f"load worker {i} exited unexpectedly (exit code {self.procs[i].exitcode})") from None

    def recv(self, i: int, timeout: float = 300.0) -> tuple:
        conn = self.conns[i]
        try:
            if not conn.poll(timeout):
                raise PerfError(f"load worker {i} did not answer within {timeout:g}s")
            msg = conn.recv()
        except (EOFError, OSError):
            self.procs[i].join(1)
            raise PerfError(f"load worker {i} exited unexpectedly (exit code {self.procs[i].exitcode})") from None
        if msg[0] == "error":
            raise PerfError(msg[1])
        return msg

    def all(self, msg: tuple, timeout: float = 300.0) -> list[tuple]:
        for i in range(len(self)):
            self.send(i, msg)
        return [self.recv(i, timeout) for i in range(len(self))]

    def collect(self, msg: tuple, timeout: float = 300.0) -> tuple[Records, dict]:
        """Send drain/stop to all: merged records, the first error message per status code,
        whether all are done, and per worker the counters (t_ns, sent, delayed, due)."""
        replies = self.all(msg, timeout)
        parts, counters, errors, done = [], [], {}, True
        for i, (_, batch) in enumerate(replies):
            parts.append(Records(batch["start"], batch["end"], batch["code"]))
            counters.append((batch["t_ns"], batch["sent"], batch["delayed"], batch["due"]))
            for k, v in batch["errors"].items():
                errors.setdefault(k, v)
            done = done and batch["done"]
            self.cpu[i] = batch["cpu_s"]
        return Records.concat(parts), {"workers": counters, "errors": errors, "done": done}


    def close(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.is_alive():
                try:
                    self.conns[i].send(("exit",))
                except (BrokenPipeError, OSError):
                    pass
        for i, proc in enumerate(self.procs):
            try:
                if self.conns[i].poll(10):
                    self.conns[i].recv()
            except (EOFError, OSError):
                pass
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            self.conns[i].close()
        self.procs, self.conns = [], []


def send_rates(before: list[tuple], after: list[tuple]) -> tuple[float, float, float]:
    """(sends/second summed over workers, share of sends >2 ms late, sends / sends due)."""
    rate = sent = delayed = due = 0.0
    for (t0, s0, l0, d0), (t1, s1, l1, d1) in zip(before, after):
        if t1 > t0:
            rate += (s1 - s0) / ((t1 - t0) / 1e9)
        sent += s1 - s0
        delayed += l1 - l0
        due += d1 - d0
    return rate, 100.0 * delayed / max(sent, 1), (min(1.0, sent / due) if due > 0 else 1.0)


def interval_schedules(intervals_us: list[int], workers: int) -> list[tuple[float, list[float]]]:
    """--request-intervals over ``workers``: send k of the whole schedule (the intervals'
    running sum, cycled) goes to worker k % workers; per worker, its first send's offset (s)
    and the gaps (ns) between its sends over one period of the pattern."""
    pattern = intervals_us * workers  # a period that every worker's share divides
    times = [0]
    for gap in pattern:
        times.append(times[-1] + gap * 1000)
    period = times[-1]
    out = []
    for w in range(workers):
        mine = times[w:len(pattern):workers]
        gaps = [b - a for a, b in zip(mine, mine[1:])] + [mine[0] + period - mine[-1]]
        out.append((mine[0] / 1e9, [float(g) for g in gaps]))
    return out


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# --------------------------------------------------------------------------- one level


class Runner:
    def __init__(self, options: PerfOptions, client: "ServerClient | HttpServerClient", model: ModelInfo,
                 pool: WorkerPool,
                 progress: "Progress") -> None:
        self.o = options
        self.client = client
        self.model = model
        self.pool = pool
        self.progress = progress

    def _label(self, level: float) -> str:
        return f"concurrency {int(level)}" if self.o.mode == "concurrency" else f"request rate {level:g}/s"

    def _start(self, level: float) -> None:
        o, n = self.o, len(self.pool)
        if o.mode == "concurrency":
            shares = _split(int(level), n)
            counts = _split(o.request_count, int(level)) if o.request_count else None
            # the request count follows the concurrency share of each worker
            start = 0
            for i, share in enumerate(shares):
                count = sum(counts[start:start + share]) if counts is not None else None
                start += share
                self.pool.send(i, ("closed", share, count))
        else:
            counts = _split(o.request_count, n) if o.request_count else [None] * n
            schedules = interval_schedules(o.intervals_us, n) if o.intervals_us else None
            for i in range(n):
                if schedules is not None:
                    offset_s, gaps = schedules[i]
                    self.pool.send(i, ("open", level / n, "intervals", offset_s, counts[i], o.max_inflight,
                                       o.seed + 1 + i, gaps))
                    continue
                offset = i / level if o.distribution == "constant" else 0.0
                self.pool.send(i, ("open", level / n, o.distribution, offset, counts[i],
                                   o.max_inflight, o.seed + 1 + i))
        for i in range(n):
            self.pool.recv(i)

    def run_level(self, level: float) -> LevelResult:
        o = self.o
        # counters and CPU at the start; nothing is in flight between levels
        _, base = self.pool.collect(("drain",))
        cpu0 = sum(self.pool.cpu) + cpu_seconds()
        wall0 = time.monotonic()
        if o.request_count:
            result = self._by_count(level, base)
        else:
            result = self._by_windows(level, base)
        result.client_cpu_s = sum(self.pool.cpu) + cpu_seconds() - cpu0
        result.wall_s = time.monotonic() - wall0
        if o.mode == "request_rate" and result.sent_fraction is not None:
            result.rate_kept = result.sent_fraction >= MIN_SENT_FRACTION
            if not result.rate_kept:
                self.progress(
                    f"{self._label(level)}: WARNING: the client could not keep the rate: it sent "
                    f"{100 * result.sent_fraction:.1f}% of the scheduled requests ({result.send_rate:.1f} req/s; "
                    f"{result.delayed_pct:.1f}% of sends >2 ms late); use more --workers or --max-inflight, or a lower rate"
                )
        if result.client.errors:
            errs = ", ".join(f"{k} x{v}" for k, v in result.client.errors.items())
            self.progress(f"{self._label(level)}: {errs}; first message: "
                          + "; ".join(f"{k}: {v}" for k, v in result.error_samples.items()))
        return result

    def _check_all_failed(self, level: float, stats: ClientStats, errors: dict[str, str]) -> None:
        if stats.success == 0 and stats.completed > 0:
            first = "; ".join(f"{k}: {v}" for k, v in errors.items())
            raise PerfError(f"{self._label(level)}: all {stats.completed} requests failed ({first})")

    def _by_count(self, level: float, base: dict) -> LevelResult:
        o = self.o
        before = self.client.statistics(o.model, o.version)
        self._start(level)
        parts, errors, counters = [], {}, {}
        while True:
            time.sleep(0.05 if not parts else 0.25)
            records, counters = self.pool.collect(("drain",))
            parts.append(records)
            errors.update({k: v for k, v in counters["errors"].items() if k not in errors})
            done_n = sum(len(p) for p in parts)
            if counters["done"]:
                break
            self.progress.status(f"{self._label(level)}: {done_n}/{o.request_count} requests")
        records, _ = self.pool.collect(("stop",))
        parts.append(records)
        after = self.client.statistics(o.model, o.version)
        records = Records.concat(parts)
        duration = int(records.end.max() - records.start.min()) if len(records) else 1
        stats = ClientStats.from_records(records, duration)
        self._check_all_failed(level, stats, errors)
        result = LevelResult(o.mode, level, o.batch_size, stats, server_delta(before, after), None, 1,
                             error_samples=errors)
        if o.mode == "request_rate" and len(records):
            # the schedule is over once the count is sent: compare the span of the sends with it
            span_s = (int(records.start.max()) - int(records.start.min())) / 1e9
            sent = len(records)
            _, result.delayed_pct, _ = send_rates(base["workers"], counters["workers"])
            result.send_rate = (sent - 1) / span_s if span_s > 0 else float(level)
            result.sent_fraction = min(1.0, result.send_rate / level)
        self.progress(f"{self._label(level)}: {stats.success} requests, "
                      f"{result.throughput:.1f} infer/s, avg {stats.latency_us.get('avg', 0):.0f} us")
        return result

    def _by_windows(self, level: float, base: dict) -> LevelResult:
        o = self.o
        interval_ns = o.interval_ms * 1_000_000
        self._start(level)
        t_prev = time.monotonic_ns()
        bounds = [t_prev]
        snaps = [self.client.statistics(o.model, o.version)]
        counters_at = [base["workers"]]
        pending = Records()
        windows: list[ClientStats] = []
        window_records: list[Records] = []
        errors: dict[str, str] = {}
        stable = False
        for trial in range(1, o.max_trials + 1):
            wait = (t_prev + interval_ns - time.monotonic_ns()) / 1e9
            if wait > 0:
                time.sleep(wait)
            t_end = time.monotonic_ns()
            snap = self.client.statistics(o.model, o.version)
            records, counters = self.pool.collect(("drain",))
            errors.update({k: v for k, v in counters["errors"].items() if k not in errors})
            pending = Records.concat([pending, records])
            inside, pending = pending.split_at(t_end)
            inside = inside.select(inside.end > t_prev)  # drop what ended before the first window
            stats = ClientStats.from_records(inside, t_end - t_prev)
            windows.append(stats)
            window_records.append(inside)
            bounds.append(t_end)
            snaps.append(snap)
            counters_at.append(counters["workers"])
            self._check_all_failed(level, stats, errors)
            err = f", {sum(stats.errors.values())} errors" if stats.errors else ""
            self.progress(
                f"{self._label(level)}: window {trial}: {stats.throughput_rps * o.batch_size:.1f} infer/s, "
                f"avg {stats.latency_us.get('avg', 0):.0f} us, p99 {stats.latency_us.get('p99', 0):.0f} us{err}"
            )
            t_prev = t_end
            if is_stable(windows, o.stability_pct, STABILITY_WINDOWS):
                stable = True
                break
        records, _ = self.pool.collect(("stop",))  # requests in flight at the end are not measured
        k = min(STABILITY_WINDOWS, len(windows))
        merged = Records.concat(window_records[-k:])
        stats = ClientStats.from_records(merged, bounds[-1] - bounds[-1 - k])
        result = LevelResult(
            o.mode, level, o.batch_size, stats, server_delta(snaps[-1 - k], snaps[-1]), stable, len(windows),
            window_history=[{"throughput": w.throughput_rps * o.batch_size, "avg_latency_us": w.latency_us.get("avg", 0.0),
                             "count": w.success} for w in windows],
            error_samples=errors,
        )
        if o.mode == "request_rate":
            result.send_rate, result.delayed_pct, result.sent_fraction = send_rates(counters_at[-1 - k], counters_at[-1])
        if stable:
            self.progress(f"{self._label(level)}: stable after {len(windows)} windows")
        else:
            self.progress(f"{self._label(level)}: WARNING: not stable within {o.max_trials} windows "
                          f"(±{o.stability_pct:g}%); reporting the last {k}. Try a longer --measurement-interval.")
        return result


# --------------------------------------------------------------------------- entry


class Progress:
    """Progress on stderr: ``line`` stays; ``status`` is transient (rewritten in place on a terminal,
    at most one line per 2 s otherwise). ``quiet`` keeps only warnings."""

    def __init__(self, quiet: bool, stream=None) -> None:  # type: ignore[no-untyped-def]
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.pending = False
        self.last = 0.0

    def _clear(self) -> None:
        if self.pending:
            self.stream.write("\r\033[K")
            self.pending = False

    def __call__(self, text: str) -> None:
        if self.quiet and "WARNING" not in text:
            return
        self._clear()
        print(f"  {text}", file=self.stream, flush=True)

    def status(self, text: str) -> None:
        if self.quiet:
            return
        if self.tty:
            self._clear()
            self.stream.write(f"  {text}")
            self.stream.flush()
            self.pending = True
        elif time.monotonic() - self.last >= 2.0:
            self.last = time.monotonic()
            print(f"  {text}", file=self.stream, flush=True)


def measure(options: PerfOptions) -> RunResult:
    """Run every load level; raises PerfError on a problem the user has to fix."""
    progress = Progress(options.quiet)
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.monotonic()
    http = options.protocol == "http"
    if http:
        from . import http as http_protocol

        client: ServerClient | http_protocol.HttpServerClient = http_protocol.HttpServerClient(
            options.url, options.connect_timeout, options.tls, options.headers)
    else:
        client = ServerClient(options.url, options.connect_timeout, options.tls, options.headers)
    shm = None
    try:
        client.check_live()
        model = client.model_info(options.model, options.version)
        steps = build_inputs(model, options)
        placements = None
        if options.shared_memory != "none":
            from .shm import SharedMemory

            shm = SharedMemory(options.shared_memory, client, options.output_shm_size)
            placements = shm.place(model, steps)
        payloads: list = (http_protocol.serialize_requests(model, steps, options, placements) if http
                          else serialize_requests(model, steps, options, placements))
        client.statistics(options.model, options.version)  # fail early if statistics are unavailable
        workers = options.workers
        if options.mode == "concurrency":
            workers = min(workers, max(int(v) for v in options.levels))
        progress(f"starting {workers} load worker process{'es' if workers > 1 else ''} against {options.url}")
        infer_path = http_protocol.model_path(options.model, options.version) + "/infer" if http else ""
        base = WorkerConfig(options.url, payloads, connect_timeout=options.connect_timeout, protocol=options.protocol,
                            infer_path=infer_path, tls=options.tls, headers=options.headers,
                            streaming=options.streaming, sequence=options.sequence if model.sequence else None,
                            workers=workers, seed=options.seed)
        if model.sequence:
            progress(f"model '{model.name}' has sequence_batching: sequences of {options.sequence.length} "
                     f"requests (±{options.sequence.variation_pct:g}%), ids from {options.sequence.id_start}")
        pool = WorkerPool(workers, base)
        levels = []
        try:
            runner = Runner(options, client, model, pool, progress)
            for level in options.levels:
                levels.append(runner.run_level(level))
        finally:
            pool.close()
        self_usage = resource.getrusage(resource.RUSAGE_SELF)
        child_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return RunResult(
            options=options, model=model, levels=levels, wall_s=time.monotonic() - wall0,
            client_cpu_user_s=(self_usage.ru_utime - self0.ru_utime) + (child_usage.ru_utime - children0.ru_utime),
            client_cpu_sys_s=(self_usage.ru_stime - self0.ru_stime) + (child_usage.ru_stime - children0.ru_stime),
            payload_bytes=[len(p[0]) if http else len(p) for p in payloads],
        )
    finally:
        if shm is not None:
            shm.close()
        client.close()
