"""What a GPU-tuned config asks of the runtime (``optimization.execution_accelerators``,
``optimization.cuda``) and of ``/metrics`` (``model_metrics``, ``metric_tags``), as plain data,
checked as Triton checks it.

Triton's repositories for GPUs carry these blocks; inferd loads them everywhere. A backend
maps what its runtime can honour (onnxruntime: the TensorRT, CUDA and OpenVINO execution
providers with their parameters, CUDA graphs) and the rest is ignored with one warning line
per model saying what and why (:func:`ignored_line`): none of them changes an answer, only
where and how fast it is computed. Refused instead (ConfigError): an accelerator name no
Triton backend knows, and a ``model_metrics`` or ``metric_tags`` entry Triton refuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferd._proto import model_config_pb2 as mc
from inferd.errors import ConfigError

# Accelerator names Triton's backends accept, by device kind (onnxruntime's; TensorRT's
# "auto_mixed_precision" and "gpu_io" are TensorFlow's, which inferd does not run).
GPU_ACCELERATORS = ("tensorrt", "cuda", "auto_mixed_precision", "gpu_io")
CPU_ACCELERATORS = ("openvino",)

# inferd's histograms whose buckets a model's config may set (model_metrics), and Triton's.
CUSTOMIZABLE_HISTOGRAMS = (
    "inferd_inference_request_duration_seconds", "inferd_inference_queue_duration_seconds",
    "inferd_inference_compute_duration_seconds", "inferd_inference_batch_size",
)
# Triton's, served under --metrics-config histogram_latencies=true (dataplane/metrics.py).
TRITON_HISTOGRAMS = ("nv_inference_first_response_histogram_ms",)
_RESERVED_LABELS = ("model", "version", "reason", "le", "gpu_uuid")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Accelerator:
    kind: str  # "gpu" or "cpu": the instance kind it applies to
    name: str
    parameters: tuple[tuple[str, str], ...] = ()

    @property
    def field(self) -> str:
        return f"optimization.execution_accelerators.{self.kind}_execution_accelerator '{self.name}'"


@dataclass(frozen=True, slots=True)
class CudaOptions:
    """``optimization.cuda``: the flags that are set."""

    graphs: bool = False
    busy_wait_events: bool = False
    output_copy_stream: bool = False
    graph_specs: int = 0

    def fields(self) -> list[str]:
        names = [f"optimization.cuda.{n}" for n in ("graphs", "busy_wait_events", "output_copy_stream")
                 if getattr(self, n)]
        if self.graph_specs:
            names.append("optimization.cuda.graph_spec")
        return names


@dataclass(frozen=True, slots=True)
class Optimization:
    accelerators: tuple[Accelerator, ...] = ()
    cuda: CudaOptions = CudaOptions()
    gather_kernel_buffer_threshold: int = 0
    eager_batching: bool = False

    def requested(self) -> list[str]:
        """Every setting asked for, by its config field (what a backend may honour or warn about)."""
        asked = [a.field for a in self.accelerators] + self.cuda.fields()
        if self.gather_kernel_buffer_threshold:
            asked.append("optimization.gather_kernel_buffer_threshold")
        if self.eager_batching:
            asked.append("optimization.eager_batching")
        return asked


def optimization(config: mc.ModelConfig) -> Optimization:
    o = config.optimization
    accelerators = tuple(
        Accelerator(kind, a.name, tuple(sorted(a.parameters.items())))
        for kind, listed in (("gpu", o.execution_accelerators.gpu_execution_accelerator),
                             ("cpu", o.execution_accelerators.cpu_execution_accelerator))
        for a in listed)
    cuda = CudaOptions(o.cuda.graphs, o.cuda.busy_wait_events, o.cuda.output_copy_stream, len(o.cuda.graph_spec))
    return Optimization(accelerators, cuda, int(o.gather_kernel_buffer_threshold), bool(o.eager_batching))


def check_accelerators(config: mc.ModelConfig) -> None:
    for a in optimization(config).accelerators:
        known = GPU_ACCELERATORS if a.kind == "gpu" else CPU_ACCELERATORS
        if not a.name:
            raise ConfigError(f"model '{config.name}': {a.field}: name is required (one of {list(known)})")
        if a.name not in known:
            raise ConfigError(f"model '{config.name}': {a.field} is not a {a.kind.upper()} execution accelerator "
                              f"Triton knows; use one of {list(known)}")


def ignored_line(model: str, ignored: list[tuple[str, str]]) -> str | None:
    """The one warning line for a model's settings nobody honoured: ``[(field, why), ...]``."""
    if not ignored:
        return None
    parts = "; ".join(f"{field} ({why})" for field, why in ignored)
    return f"model '{model}': ignored optimization settings (answers are unchanged, only speed): {parts}"


# -- model_metrics and metric_tags -------------------------------------------------------------


def histogram_buckets(config: mc.ModelConfig) -> tuple[dict[str, tuple[float, ...]], list[str]]:
    """``model_metrics``: bucket overrides by family, and the warnings for families that take none.
    Refused in Triton's words (its QA matches them): a control without identifier or options,
    an empty family, empty or unordered buckets."""
    name = config.name
    buckets: dict[str, tuple[float, ...]] = {}
    warnings: list[str] = []
    for i, control in enumerate(config.model_metrics.metric_control):
        where = f"model '{name}': model_metrics.metric_control[{i}]"
        if not control.HasField("metric_identifier"):
            raise ConfigError(f"{where}: metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            raise ConfigError(f"{where}: metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            raise ConfigError(f"{where}: metric control must specify 'histogram_options'")
        family = control.metric_identifier.family
        values = tuple(float(b) for b in control.histogram_options.buckets)
        if not values:
            raise ConfigError(f"{where}: histogram options must specify non-empty 'buckets'")
        if any(b2 <= b1 for b1, b2 in zip(values, values[1:])):
            raise ConfigError(f"{where}: histogram_options.buckets {list(values)} for family '{family}' must be "
                              "strictly increasing")
        if family in CUSTOMIZABLE_HISTOGRAMS or family in TRITON_HISTOGRAMS:
            buckets[family] = values
        else:
            warnings.append(f"model '{name}': model_metrics: Metric family '{family}' in 'metric_identifier' is not "
                            f"a customizable metric in Triton core. inferd's customizable histograms: "
                            f"{list(TRITON_HISTOGRAMS + CUSTOMIZABLE_HISTOGRAMS)}")
    return buckets, warnings


def metric_tags(config: mc.ModelConfig) -> tuple[tuple[str, str], ...]:
    """``metric_tags``: extra labels on this model's series in ``/metrics``, checked as label names."""
    for key in config.metric_tags:
        if not _LABEL.match(key) or key.startswith("__"):
            raise ConfigError(f"model '{config.name}': metric_tags key '{key}' is not a Prometheus label name "
                              "(letters, digits and '_', not starting with a digit or '__')")
        if key in _RESERVED_LABELS:
            raise ConfigError(f"model '{config.name}': metric_tags key '{key}' is a label the server sets itself "
                              f"({', '.join(_RESERVED_LABELS)}); choose another name")
    return tuple(sorted(config.metric_tags.items()))
