"""CPU per inference for each process of a running server, from /proc and the server's counts.

    python -m bench.proc_cpu --pid PID --url 127.0.0.1:8001 [--seconds 10] [--windows 1] [--json]

The server's processes are the one named by ``--pid`` (the core) and every process
below it (frontend workers, found through /proc's parent links), plus the members of
its process group when it leads one. Each process's CPU is utime + stime from
``/proc/<pid>/stat`` (all its threads, in clock ticks); the inferences are the
server's own count, the sum of ``inference_count`` over ModelStatistics (rows, as
Triton and perf_analyzer count them), both taken at the start and the end of a
window. A process that starts inside the window (a restarted frontend) counts from
zero; one that exits inside it is reported as gone, its last CPU unknown.

From a benchmark::

    meter = CpuMeter(server_pid, statistics_count(url))
    before = meter.sample()
    ...                                   # drive load
    report = meter.since(before)          # CpuReport: per process and in total
    report.per_inference_us("core")

Linux only (/proc). The clock tick is usually 10 ms, so windows of a few seconds
under load are needed for a figure to the microsecond per inference.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# The /proc reader is inferd's own (inferd tune reads it too); re-exported for the benchmarks.
from inferd.observability.procfs import PROC, TICK, Stat, all_stats, parse_stat, read_stat, server_tree

__all__ = ["PROC", "TICK", "Stat", "all_stats", "parse_stat", "read_stat", "server_tree", "voluntary_switches",
           "role", "CpuMeter", "CpuReport", "Snapshot", "report", "statistics_count", "children_cpu_s", "alive"]

CORE = "core"
WORKER_MODULE = "inferd.serve.worker_process"  # a frontend worker's command line names this module
HOST_MODULE = "inferd.serve.host_process"  # a model host's


def voluntary_switches(pid: int, proc: Path = PROC) -> int:
    """How often the process's threads blocked and were woken again (voluntary context switches,
    summed over /proc/<pid>/task/*/status): its wake-ups, a count that load does not inflate (a busy
    machine adds involuntary switches instead). 0 when the process is gone."""
    total = 0
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
        except OSError:  # a thread that ended meanwhile
            continue
    return total


def role(pid: int, root: int, proc: Path = PROC) -> str:
    """``core`` for the root, ``frontend K`` for a frontend worker, ``host <model>-<instance>`` for a model
    host, else the process's command name."""
    if pid == root:
        return CORE
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    words = [a.decode(errors="replace") for a in argv if a]
    if WORKER_MODULE in words:
        index = words[words.index("--index") + 1] if "--index" in words[:-1] else "?"
        return f"frontend {index}"
    if HOST_MODULE in words:  # a host forked by the zygote keeps its command line: its name tells
        try:
            name = (proc / str(pid) / "comm").read_text().strip()
        except OSError:
            return "gone"
        return "host zygote" if name == "inferd-zygote" else f"host {name.removeprefix('host:')}"
    try:
        return (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return "gone"


# -- windows --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    when: float  # monotonic seconds
    inferences: int
    processes: dict[tuple[int, int], tuple[str, int]]  # (pid, start) -> (role, ticks)


@dataclass(slots=True)
class ProcessCpu:
    pid: int
    role: str
    cpu_s: float
    per_inference_us: float
    note: str = ""


@dataclass(slots=True)
class CpuReport:
    seconds: float
    inferences: int
    processes: list[ProcessCpu] = field(default_factory=list)

    @property
    def total_cpu_s(self) -> float:
        return sum(p.cpu_s for p in self.processes)

    def per_inference_us(self, role_prefix: str = "") -> float:
        """CPU us per inference summed over the processes whose role starts with ``role_prefix``
        ("core", "frontend"; "" for the whole server)."""
        cpu = sum(p.cpu_s for p in self.processes if p.role.startswith(role_prefix))
        return cpu / self.inferences * 1e6 if self.inferences else 0.0

    def as_dict(self) -> dict:
        return {"seconds": round(self.seconds, 3), "inferences": self.inferences,
                "total_cpu_s": round(self.total_cpu_s, 3),
                "per_inference_us": round(self.per_inference_us(), 1),
                "processes": [{"pid": p.pid, "role": p.role, "cpu_s": round(p.cpu_s, 3),
                               "per_inference_us": round(p.per_inference_us, 1), "note": p.note}
                              for p in self.processes]}

    def table(self) -> str:
        lines = [f"{self.inferences} inferences in {self.seconds:.1f} s "
                 f"({self.inferences / self.seconds if self.seconds else 0:,.0f}/s)",
                 f"{'process':<14} {'pid':>8} {'cpu s':>8} {'us/inference':>13}"]
        for p in self.processes:
            lines.append(f"{p.role:<14} {p.pid:>8} {p.cpu_s:>8.2f} {p.per_inference_us:>13.1f} {p.note}".rstrip())
        lines.append(f"{'all':<14} {'':>8} {self.total_cpu_s:>8.2f} {self.per_inference_us():>13.1f}")
        return "\n".join(lines)


class CpuMeter:
    """Samples a server's processes and inference count; :meth:`since` makes the report."""

    def __init__(self, root_pid: int, count: Callable[[], int], proc: Path = PROC,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root_pid
        self.count = count
        self.proc = proc
        self.clock = clock

    def sample(self) -> Snapshot:
        inferences = self.count()
        stats = server_tree(self.root, all_stats(self.proc))
        processes = {(s.pid, s.start): (role(s.pid, self.root, self.proc), s.ticks) for s in stats}
        return Snapshot(self.clock(), inferences, processes)

    def since(self, before: Snapshot, after: Snapshot | None = None) -> CpuReport:
        after = after or self.sample()
        return report(before, after)


def report(before: Snapshot, after: Snapshot) -> CpuReport:
    """Per process, the CPU it used between the two snapshots, over the inferences done meanwhile."""
    n = after.inferences - before.inferences
    out = CpuReport(seconds=after.when - before.when, inferences=n)
    for key, (name, ticks) in after.processes.items():
        start_ticks = before.processes.get(key, (name, 0))[1]
        cpu = (ticks - start_ticks) / TICK
        note = "" if key in before.processes else "started in the window"
        out.processes.append(ProcessCpu(key[0], name, cpu, cpu / n * 1e6 if n else 0.0, note))
    for key, (name, _) in before.processes.items():
        if key not in after.processes:
            out.processes.append(ProcessCpu(key[0], name, 0.0, 0.0, "gone: exited in the window"))
    out.processes.sort(key=lambda p: (p.role != CORE, p.role, p.pid))
    return out


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children that have been waited for: a load
    client run with subprocess.run, whose own CPU comes out of the cores the server shares."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def alive(pid: int) -> bool:
    """Whether the process ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def statistics_count(url: str, timeout: float = 10.0, model: str = "") -> Callable[[], int]:
    """The server's inference count (sum of ModelStatistics inference_count) over gRPC; ``model``: that
    model's own (an ensemble's, not its steps')."""
    import grpc

    from inferd._proto import grpc_service_pb2 as pb
    from inferd._proto import grpc_service_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(url)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)

    def count() -> int:
        reply = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=timeout)
        return sum(m.inference_count for m in reply.model_stats)

    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proc_cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=int, required=True, help="the server's (core's) process id")
    parser.add_argument("--url", required=True, help="its gRPC address, for ModelStatistics (host:port)")
    parser.add_argument("--seconds", type=float, default=10.0, help="window length (default 10)")
    parser.add_argument("--windows", type=int, default=1, help="consecutive windows to report (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON object per window")
    args = parser.parse_args(argv)
    if read_stat(args.pid) is None:
        print(f"proc_cpu: no process {args.pid}", file=sys.stderr)
        return 1
    meter = CpuMeter(args.pid, statistics_count(args.url))
    before = meter.sample()
    for _ in range(max(args.windows, 1)):
        time.sleep(args.seconds)
        after = meter.sample()
        result = report(before, after)
        print(json.dumps(result.as_dict()) if args.json else result.table(), flush=True)
        before = after
    return 0


if __name__ == "__main__":
    sys.exit(main())
