"""What one run measured: a :class:`LevelResult` per load level inside a :class:`RunResult`.
Plain data, shared by the runner that fills them and the report that prints them."""

from __future__ import annotations

from dataclasses import dataclass, field

from .windows import ClientStats
from .inputs import ModelInfo
from .options import PerfOptions


@dataclass
class LevelResult:
    mode: str  # "concurrency" | "request_rate"
    level: float
    batch_size: int
    client: ClientStats
    server: dict[str, float]
    stable: bool | None  # None: --request-count (no stability check)
    windows: int  # windows measured; the last min(3, windows) are reported
    window_history: list[dict[str, float]] = field(default_factory=list)
    send_rate: float | None = None  # open loop: achieved sends/second
    delayed_pct: float | None = None  # open loop: sends later than scheduled by > 2 ms
    sent_fraction: float | None = None  # open loop: sends / sends due by the schedule
    rate_kept: bool | None = None
    client_cpu_s: float = 0.0
    wall_s: float = 0.0
    error_samples: dict[str, str] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Inferences per second (requests x batch size), as perf_analyzer counts them."""
        return self.client.throughput_rps * self.batch_size

    @property
    def network_us(self) -> float:
        """perf_analyzer's "Network+Server Send/Recv": client latency minus server queue+compute."""
        s = self.server
        server_us = s["queue_avg_us"] + s["compute_input_avg_us"] + s["compute_infer_avg_us"] + s["compute_output_avg_us"]
        return max(0.0, self.client.latency_us.get("avg", 0.0) - server_us)


@dataclass
class RunResult:
    options: PerfOptions
    model: ModelInfo
    levels: list[LevelResult]
    wall_s: float
    client_cpu_user_s: float
    client_cpu_sys_s: float
    payload_bytes: list[int]

    @property
    def client_cpu_s(self) -> float:
        return self.client_cpu_user_s + self.client_cpu_sys_s
