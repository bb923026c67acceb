"""inferd's own settings, carried in a config's ``parameters`` map.

They live under keys prefixed ``inferd.`` so a repository stays loadable by
Triton, which ignores parameters it does not know. A key with the prefix that
inferd does not know is refused (a typo must not silently do nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from inferd._proto import model_config_pb2 as mc
from inferd.config._openai import is_openai_key
from inferd.errors import ConfigError
from inferd.suggest import did_you_mean

PREFIX = "inferd."


@dataclass(frozen=True, slots=True)
class InferdParameters:
    # Promote a queued request one priority level per this many microseconds
    # (0 = strict priority, as Triton).
    priority_aging_microseconds: int = 0
    # Split a request whose batch exceeds max_batch_size across executions.
    split_large_requests: bool = False
    # Where an instance executes: "auto" runs fast models on the event loop
    # and slow ones on the instance's worker thread; "thread" or "inline" force it.
    execution: str = "auto"
    # "auto" mode: a model whose executions take longer than this runs on a thread.
    inline_max_microseconds: int = 1000
    # Where the model's instances live: "process" (each in a model host process of its own, as
    # Triton runs Python models), "inline" (in the server's core process), or "" (the server's
    # --model-host choice: Python models in hosts, the others inline).
    host: str = ""
    # How long a batch waits for company within max_queue_delay_microseconds: "adaptive" only while
    # company is expected before it ends; "fixed" all of it, as Triton (inferd/scheduling/adaptive.py).
    batch_wait: str = "adaptive"
    # A latency SLO per request (0: none): waits and batch sizes keep the oldest request within it,
    # and a request whose estimated completion passes it is refused at once (UNAVAILABLE).
    max_latency_microseconds: int = 0
    # Batches assembled in, and outputs written to, buffers each instance keeps and reuses.
    pooled_buffers: bool = True
    # An execution that runs longer fails its batch (DEADLINE_EXCEEDED) and its instance is
    # retired and replaced (0: no limit). The model then always executes on its threads.
    execution_timeout_microseconds: int = 0
    # Retired instances whose stuck execution has not returned, per instance, before it stops
    # being replaced (and answers UNAVAILABLE until one returns).
    max_retired_instances: int = 2
    # Variable-length batching (docs in inferd/config/_varlen.py, README "Variable-length batching"):
    # requests of different lengths share a batch, padded to its longest.
    padding: bool = False
    pad_value: str = ""  # "VALUE" for every padded input, or "NAME:VALUE,..." (default 0)
    lengths_input: str = ""  # a config input inferd fills with each row's length
    mask_input: str = ""  # a config input inferd fills with 1 for real positions, 0 for padding
    unpad_outputs: str = ""  # "OUTPUT:INPUT,OUTPUT:none,...": which input an output's variable dims follow
    length_buckets: str = ""  # "16,32,64": a batch holds requests of one bucket only
    max_batch_elements: int = 0  # rows x longest length of a batch stays <= this (0: no budget)
    # sequence_batching.iterative_sequence: a tensor step model's output that
    # ends its sequence when nonzero (Python models end by not rescheduling).
    iterative_end_output: str = ""
    # Priorities of an iterative-sequence model (it has no dynamic_batching
    # block): as dynamic_batching's priority_levels / default_priority_level.
    priority_levels: int = 0
    default_priority_level: int = 0
    # --model-control-mode on_demand (inferd/repository/demand.py): never evicted to make room
    # under --model-memory-budget (loaded at start-up), and kept loaded at least this long after
    # its last request.
    pinned: bool = False
    keep_warm_seconds: int = 0

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> "InferdParameters":
        known = {f.name: f for f in fields(cls)}
        values: dict[str, object] = {}
        for key, param in config.parameters.items():
            if not key.startswith(PREFIX) or is_openai_key(key):  # /v1's own: config/_openai.py
                continue
            name = key[len(PREFIX):]
            if name.startswith("step.") and config.platform == "ensemble":
                continue  # an ensemble step's rule: the ensemble's graph reads it (inferd.config._ensemble)
            if name not in known:
                keys = sorted(PREFIX + k for k in known)
                raise ConfigError(
                    f"model '{config.name}': unknown parameter '{key}'{did_you_mean(key, keys)} "
                    f"(known inferd parameters: {', '.join(keys)})"
                )
            raw = param.string_value.strip()
            default = known[name].default
            try:
                if isinstance(default, bool):
                    if raw.lower() not in ("true", "false", "1", "0"):
                        raise ValueError
                    values[name] = raw.lower() in ("true", "1")
                elif isinstance(default, int):
                    values[name] = int(raw)
                    if values[name] < 0:  # type: ignore[operator]
                        raise ValueError
                else:
                    values[name] = raw
            except ValueError:
                kind = "true or false" if isinstance(default, bool) else "an integer >= 0"
                raise ConfigError(
                    f"model '{config.name}': parameter '{key}' must be {kind}, got '{raw}'"
                ) from None
        params = cls(**values)  # type: ignore[arg-type]
        if params.batch_wait not in ("adaptive", "fixed"):
            raise ConfigError(
                f"model '{config.name}': parameter 'inferd.batch_wait' must be adaptive or fixed, "
                f"got '{params.batch_wait}'"
            )
        if params.max_latency_microseconds and config.HasField("sequence_batching"):
            raise ConfigError(
                f"model '{config.name}': parameter 'inferd.max_latency_microseconds' applies to the dynamic batcher "
                "and the default scheduler; a sequence batcher's requests must run in their sequence, so it cannot "
                "refuse or reorder them: remove the parameter or sequence_batching"
            )
        if params.max_latency_microseconds and config.platform == "ensemble":
            raise ConfigError(
                f"model '{config.name}': parameter 'inferd.max_latency_microseconds' is not supported on an ensemble; "
                "set it on the composing models, whose schedulers admit and batch the steps"
            )
        if params.execution not in ("auto", "thread", "inline"):
            raise ConfigError(
                f"model '{config.name}': parameter 'inferd.execution' must be auto, thread or inline, "
                f"got '{params.execution}'"
            )
        if params.host not in ("", "process", "inline"):
            raise ConfigError(
                f"model '{config.name}': parameter 'inferd.host' must be process or inline, got '{params.host}'"
            )
        if params.host == "process" and params.execution == "inline":
            raise ConfigError(
                f"model '{config.name}': parameter 'inferd.execution' is 'inline', but 'inferd.host' is 'process': "
                "a hosted model runs in its host process, never on the server's event loop"
            )
        if params.execution_timeout_microseconds and params.execution == "inline":
            raise ConfigError(
                f"model '{config.name}': parameter 'inferd.execution_timeout_microseconds' needs the model to "
                "execute on its instances' threads (an execution on the event loop cannot be timed out); "
                "remove 'inferd.execution: inline'"
            )
        iterative = config.HasField("sequence_batching") and config.sequence_batching.iterative_sequence
        for key, value in (("iterative_end_output", params.iterative_end_output),
                           ("priority_levels", params.priority_levels)):
            if value and not iterative:
                raise ConfigError(
                    f"model '{config.name}': parameter 'inferd.{key}' applies to sequence_batching "
                    "{ iterative_sequence: true } models only"
                    + (" (use dynamic_batching.priority_levels)" if key == "priority_levels" else "")
                )
        if params.default_priority_level > params.priority_levels or (
                params.priority_levels and not params.default_priority_level):
            raise ConfigError(
                f"model '{config.name}': parameter 'inferd.default_priority_level' must be in "
                f"1..inferd.priority_levels ({params.priority_levels}), got {params.default_priority_level}"
            )
        return params
