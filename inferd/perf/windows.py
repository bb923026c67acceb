"""Request records -> statistics: windows, exact percentiles over merged samples, stability,
server-side deltas."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
import numpy as np

PERCENTILES = (50, 90, 95, 99)
STABILITY_WINDOWS = 3  # perf_analyzer's: the last 3 windows must agree
_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


@dataclass
class Records:
    """Completed requests: start/end (monotonic ns) and gRPC status code."""

    start: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    end: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    code: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))

    def __len__(self) -> int:
        return int(self.end.size)

    @staticmethod
    def concat(parts: list["Records"]) -> "Records":
        parts = [p for p in parts if len(p)]
        if not parts:
            return Records()
        return Records(
            np.concatenate([p.start for p in parts]),
            np.concatenate([p.end for p in parts]),
            np.concatenate([p.code for p in parts]),
        )

    def select(self, mask: np.ndarray) -> "Records":
        return Records(self.start[mask], self.end[mask], self.code[mask])

    def split_at(self, t_ns: int) -> tuple["Records", "Records"]:
        """(ended at or before ``t_ns``, ended after it)."""
        mask = self.end <= t_ns
        return self.select(mask), self.select(~mask)


def percentile_index(p: float, n: int) -> int:
    """perf_analyzer's rank: ``latencies[(p / 100) * (n - 1) + 0.5]`` of the sorted samples."""
    return int((p / 100.0) * (n - 1) + 0.5)


@dataclass
class ClientStats:
    duration_s: float
    completed: int  # successes + errors
    success: int
    errors: dict[str, int]  # gRPC status code name -> count
    throughput_rps: float  # successful requests per second
    latency_us: dict[str, float]  # avg, min, max, std, p50, p90, p95, p99 (successful requests)

    @classmethod
    def from_records(cls, records: Records, duration_ns: int) -> "ClientStats":
        ok = records.code == 0
        latencies = np.sort(records.end[ok] - records.start[ok])
        errors: dict[str, int] = {}
        if not ok.all():
            codes, counts = np.unique(records.code[~ok], return_counts=True)
            errors = {_CODE_NAMES.get(int(c), str(int(c))): int(n) for c, n in zip(codes, counts)}
        n = int(latencies.size)
        lat: dict[str, float] = {}
        if n:
            lat = {
                "avg": float(latencies.mean()) / 1e3,
                "min": float(latencies[0]) / 1e3,
                "max": float(latencies[-1]) / 1e3,
                "std": float(latencies.std()) / 1e3,
            }
            for p in PERCENTILES:
                lat[f"p{p}"] = float(latencies[percentile_index(p, n)]) / 1e3
        duration_s = max(duration_ns, 1) / 1e9
        return cls(duration_s, len(records), n, errors, n / duration_s, lat)


def is_stable(windows: list[ClientStats], percentage: float, count: int = 3) -> bool:
    """perf_analyzer's rule: the last ``count`` windows all have throughput, and max/min of both
    throughput and average latency is within ``1 + percentage/100``."""
    if len(windows) < count:
        return False
    last = windows[-count:]
    if any(w.success == 0 for w in last):
        return False
    limit = 1.0 + percentage / 100.0
    thr = [w.throughput_rps for w in last]
    lat = [w.latency_us["avg"] for w in last]
    return max(thr) / min(thr) <= limit and max(lat) / max(min(lat), 1e-9) <= limit


def server_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """ModelStatistics counter deltas and per-request averages in microseconds."""
    d = {k: after[k] - before[k] for k in after}
    out: dict[str, float] = {
        "success_count": d["success_count"],
        "fail_count": d["fail_count"],
        "inference_count": d["inference_count"],
        "execution_count": d["execution_count"],
    }
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        count = d[f"{key}_count"]
        out[f"{key}_avg_us"] = d[f"{key}_ns"] / count / 1e3 if count else 0.0
    out["request_avg_us"] = out.pop("success_avg_us")
    compute = out["compute_input_avg_us"] + out["compute_infer_avg_us"] + out["compute_output_avg_us"]
    out["overhead_avg_us"] = max(0.0, out["request_avg_us"] - out["queue_avg_us"] - compute)
    return out
