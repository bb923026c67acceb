"""A scripted load client for ``inferd tune``'s search: noisy figures on a fake clock.

The noise is what a shared 2-core host does to a round: other processes' load wanders (a random
walk between 0 and 1.8 cores, ``drift`` cores a round, reported as the round's ``others_cores``, as
/proc would) and takes throughput with it (``load_effect`` per core, in log terms: a slow swing
that pairs of adjacent rounds mostly cancel), and each round has its own independent wobble
(``noise``, the sd of a log-normal factor), which they do not. Each candidate's true throughput
relative to the current configuration is ``truth`` (1.0 unless given). A round costs
``round_s`` of fake time. Everything is seeded: the same seed gives the same run.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from inferd.config import ModelConfig, parse_config_text
from inferd.tune.rounds import Round
from inferd.tune.space import Candidate


def model_config(max_batch_size: int) -> ModelConfig:
    """The tuned model's config: an ONNX model "m" of one FP32 [4] input, dynamic batching, one CPU instance."""
    return parse_config_text(f"""
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ }}
""", model="m")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeHost:
    clock: FakeClock
    seed: int = 0
    noise: float = 0.06
    load_effect: float = -0.8  # log throughput per core of others' load
    drift: float = 0.1  # sd of the others' load's step from one round to the next, in cores
    truth: dict[Candidate, float] = field(default_factory=dict)
    p99_truth_us: dict[Candidate, float] = field(default_factory=dict)
    base_throughput: float = 1500.0
    base_p99_us: float = 8000.0
    round_s: float = 1.2
    calls: list[tuple[Candidate, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.load = 0.6

    def __call__(self, candidate: Candidate, level: float) -> Round:
        self.calls.append((candidate, level))
        self.clock.now += self.round_s
        self.load = min(1.8, max(0.0, self.load + self.rng.gauss(0, self.drift)))
        wobble = self.rng.gauss(0, self.noise)
        factor = math.exp(self.load_effect * self.load + wobble)
        truth = self.truth.get(candidate, 1.0)
        p99 = self.p99_truth_us.get(candidate, self.base_p99_us / truth)
        return Round(candidate, level, throughput=self.base_throughput * truth * factor, p50_us=p99 / 3,
                     p99_us=p99 * math.exp(0.5 * self.load + wobble), server_cpu_us=300.0 / truth * math.exp(wobble / 2),
                     others_cores=self.load, wall_s=self.round_s)
