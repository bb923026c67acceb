"""A loaded model version: its spec, scheduler and statistics."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inferd.config import ModelSpec
from inferd.observability.stats import ModelStats
from inferd.scheduling.base import Scheduler

if TYPE_CHECKING:
    from inferd.model.cache import ResponseCache


@dataclass(eq=False)
class Model:
    spec: ModelSpec
    version: int
    scheduler: Scheduler
    stats: ModelStats
    model_dir: Path
    decoupled: bool = False  # model_transaction_policy.decoupled: responses only stream
    # The torch device every instance takes and gives tensors on ("cuda:0", "cpu": TorchScript
    # instances all on one device), or None: its inputs must be host numpy arrays.
    tensor_device: str | None = None
    # The server's response cache, when the config enables it and the server has one.
    cache: "ResponseCache | None" = None

    @property
    def name(self) -> str:
        return self.spec.name
