"""The TorchScript backend (platform ``pytorch_libtorch``, backend ``pytorch``).

A ``model.pt`` saved by ``torch.jit.save`` is loaded with ``torch.jit.load``
onto the instance's device (``cpu``, or ``cuda:k`` for KIND_GPU) and called
under ``torch.inference_mode``.

Tensor names follow Triton's pytorch backend:

- inputs: either every config input is named like an argument of ``forward``
  (matched by name), or every one follows the ``<name>__<index>`` convention
  (``INPUT__0`` is forward's first argument after ``self``);
- outputs: if every config output follows ``<name>__<index>`` the index picks
  the element of the tuple ``forward`` returns; otherwise the outputs are
  taken in the order the config lists them.

A TorchScript file has no signature inferd could read types and shapes from,
so the config must list every input and output.

Strings (TYPE_STRING), as Triton's pytorch backend takes them: a string input
is passed to forward as one ``List[str]`` (a batch joined into one list), and
a ``List[str]`` that forward returns (alone or in its tuple) is a string
output. The list is the tensor's only dimension, so a string tensor must be
one-dimensional as the model sees it: ``dims: [n]`` on a model that does not
batch, ``dims: [1]`` with ``reshape: { shape: [] }`` on one that does. Bytes
travel as UTF-8 text (TorchScript's ``str``); a request whose bytes are not
UTF-8 is refused on its own (INVALID_ARGUMENT), the rest of its batch runs.

Parameters (the keys of Triton's pytorch backend, ``parameters`` in the config):

- ``INTRA_OP_THREAD_COUNT``: threads one execution may use. ``torch.set_num_threads``
  is process-wide in principle; inferd calls it on the thread that executes,
  before each execution whose thread count differs, so with torch's OpenMP
  build (the usual CPU build, where the count is kept per thread) each
  instance gets its own. Default: the instance's share of the cores (cores /
  CPU instances), as for onnxruntime. With other thread pools the last
  setting wins process-wide.
- ``INTER_OP_THREAD_COUNT``: the inter-op pool (``torch.jit.fork``). Truly
  process-wide and settable only before torch first uses it: the first model
  that asks sets it; a later different request is logged and has no effect.
- ``INFERENCE_MODE`` (default true): ``torch.inference_mode``; false runs under
  ``torch.no_grad`` instead.
- ``DISABLE_OPTIMIZED_EXECUTION`` (default false): run with
  ``torch.jit.optimized_execution(False)``.
- ``ENABLE_CACHE_CLEANING`` (default false): ``torch.cuda.empty_cache()`` after
  each execution on a GPU instance.
- ``ENABLE_NVFUSER``, ``ENABLE_WEIGHT_SHARING``, ``ENABLE_JIT_EXECUTOR``,
  ``ENABLE_JIT_PROFILING``: accepted so Triton repositories load; they have no
  effect here and a warning says so.

Data (inferd/backends/torch_device.py): on the CPU a lone request's inputs become
tensors without copying where the layout allows (``torch.from_numpy``; the
request's read-only buffers are shared, so a model that writes into its inputs in
place writes into the request's copy only) and a batch is joined once. On
``cuda:k`` each instance has its own CUDA stream and thread: the batch is joined
once into pinned host memory and copied to the device in one non-blocking copy
per input, outputs come back once through pinned memory, and inputs already on
the device (CUDA shared memory, an ensemble step's output) are not moved through
the host. BF16 travels as 16-bit words: ``ml_dtypes.bfloat16`` numpy <->
``torch.bfloat16`` through an int16 view.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np


from inferd.backends.base import (
    Backend, BatchResult, ExecutionTimes, InstanceSpec, ModelInstance, RequestInputs, int_parameter, split_batch,
)
from inferd.backends.batching import join, split
from inferd.backends.torch_device import TorchStager
from inferd.config import ModelConfig, ModelSignature, ModelSpec, TensorSpec
from inferd.dtypes import DataType
from inferd.errors import ConfigError, InferdError, InvalidArgument, ModelExecutionError
from inferd.gpu.inventory import default_inventory

log = logging.getLogger(__name__)

# torch warns (once) when given a read-only numpy array; the request's buffers
# are read-only by design and shared on purpose (see the module docstring).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)

_CONVENTION = re.compile(r"^(.*)__(\d+)$")
_NO_EFFECT = ("ENABLE_NVFUSER", "ENABLE_WEIGHT_SHARING", "ENABLE_JIT_EXECUTOR", "ENABLE_JIT_PROFILING")
_BOOL_PARAMS = ("INFERENCE_MODE", "DISABLE_OPTIMIZED_EXECUTION", "ENABLE_CACHE_CLEANING") + _NO_EFFECT

_interop_lock = threading.Lock()
_interop_set_by: str | None = None


def _torch():  # type: ignore[no-untyped-def]
    import torch

    return torch


def torch_dtypes() -> dict[str, Any]:
    """Wire type name -> torch dtype, for every type TorchScript models can take."""
    torch = _torch()
    return {
        "BOOL": torch.bool,
        "UINT8": torch.uint8,
        "INT8": torch.int8,
        "INT16": torch.int16,
        "INT32": torch.int32,
        "INT64": torch.int64,
        "FP16": torch.float16,
        "BF16": torch.bfloat16,
        "FP32": torch.float32,
        "FP64": torch.float64,
    }


def convention_index(name: str) -> int | None:
    """The index of a ``<name>__<index>`` tensor name, or None."""
    m = _CONVENTION.match(name)
    return int(m.group(2)) if m else None


class TorchScriptBackend(Backend):
    name = "pytorch"
    platform = "pytorch_libtorch"
    default_filename = "model.pt"
    file_suffixes = (".pt",)
    gpu_requirement = "this torch has no CUDA"

    def __init__(self) -> None:
        self._gpu: bool | None = None

    def signature(self, model_file: Path, model_name: str) -> ModelSignature | None:
        return None  # TorchScript records no tensor types or shapes

    def gpu_available(self) -> bool:
        if self._gpu is None:
            self._gpu = bool(default_inventory().gpus())  # the GPUs placement sees (torch's view)
        return self._gpu

    def complete_config(self, config: ModelConfig, model_file: Path) -> None:
        # The first call at load that names the model: PyTorch is an extra (inferd[torch]).
        try:
            _torch()
        except ImportError as exc:
            raise ConfigError(
                f"model '{config.name}': the TorchScript backend (platform pytorch_libtorch) needs PyTorch, "
                f"which is not installed ({exc}); install it with: pip install 'inferd[torch]' "
                "(in an inferd checkout: pip install -e '.[torch]')"
            ) from None
        missing = [kind for kind, tensors in (("input", config.input), ("output", config.output)) if not tensors]
        if missing:
            raise ConfigError(
                f"model '{config.name}': a TorchScript model carries no tensor signature, so config.pbtxt must "
                f"list every {' and '.join(missing)} (name, data_type, dims); use INPUT__0/OUTPUT__0 names "
                "or forward()'s argument names"
            )

    def create_instance(self, spec: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        return TorchScriptInstance(self, spec, instance)


class TorchScriptInstance(ModelInstance):
    def __init__(self, backend: TorchScriptBackend, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        torch = _torch()
        self._torch = torch
        name = spec.name
        params = {k: v.strip() for k, v in spec.parameters.items()}
        self._check_types(spec)
        self._device = self._torch_device(backend, spec, instance)
        self._cuda = self._device.type == "cuda"

        threads = int_parameter(name, params, "INTRA_OP_THREAD_COUNT", 0)
        self._threads = threads or instance.threads
        interop = int_parameter(name, params, "INTER_OP_THREAD_COUNT", 0)
        if interop:
            _set_interop_threads(name, interop)
        flags = {key: _bool_param(name, params, key, default=key == "INFERENCE_MODE") for key in _BOOL_PARAMS}
        self._inference_mode = flags["INFERENCE_MODE"]
        self._optimized = not flags["DISABLE_OPTIMIZED_EXECUTION"]
        self._clean_cache = flags["ENABLE_CACHE_CLEANING"] and self._cuda
        for key in _NO_EFFECT:
            if key in params:
                log.warning("model '%s': parameter %s has no effect in inferd's TorchScript backend", name, key)

        path = instance.model_file
        try:
            module = torch.jit.load(str(path), map_location=self._device)
        except Exception as exc:  # torch raises RuntimeError/ValueError with the reason
            raise ConfigError(f"model '{name}': torch.jit.load cannot load {path}: {exc}") from None
        module.eval()
        self.module = module
        self._map_inputs(module)
        self._map_outputs()
        every_input = {**spec.inputs, **spec.filled_inputs}  # with batch_input targets
        self._input_dtypes: dict[str, Any] = {n: t.datatype.numpy for n, t in every_input.items()}
        self._input_dtypes.update({n: d.numpy for n, d in _supplied_inputs(spec).items()})
        # Tensors whose first dimension is not the batch: ragged concatenations, batch inputs,
        # scattered batch outputs (Triton's ragged batching).
        varlen = spec.varlen
        self._unbatched_inputs = (varlen.ragged | {t for b in varlen.batch_inputs for t in b.targets}
                                  if varlen is not None else frozenset())
        self._scattered = {t for b in varlen.batch_outputs for t in b.targets} if varlen is not None else set()
        self._stager = TorchStager(torch, self._device)
        # Where this instance takes and gives torch tensors: an ensemble keeps a step's outputs
        # there when its next steps run on the same device (Model.tensor_device).
        self.tensor_device = str(self._device)
        # A GPU instance waits for its stream each batch, and two instances overlap only on their
        # own threads: never inline on the event loop.
        self.thread_only = self._cuda

    # -- load-time checks ------------------------------------------------------

    @staticmethod
    def _check_types(spec: ModelSpec) -> None:
        supported = torch_dtypes()
        for kind, tensors in (("input", {**spec.inputs, **spec.filled_inputs}), ("output", spec.outputs)):
            for t in tensors.values():
                if t.datatype.name == "BYTES":
                    _check_string_shape(spec, kind, t)
                elif t.datatype.name not in supported:
                    raise ConfigError(
                        f"model '{spec.name}': {kind} '{t.name}' has data_type {t.datatype.config}, which the "
                        f"TorchScript backend does not support (supported: "
                        f"{', '.join('TYPE_' + n for n in supported)}, and TYPE_STRING as List[str])"
                    )

    def _torch_device(self, backend: TorchScriptBackend, spec: ModelSpec, instance: InstanceSpec):  # type: ignore[no-untyped-def]
        torch = self._torch
        if instance.device.kind != "cuda":
            return torch.device("cpu")
        if not backend.gpu_available():
            raise ConfigError(
                f"model '{spec.name}': instance '{instance.name}' asks for GPU {instance.device.index}, but this "
                "torch has no CUDA (torch.cuda.is_available() is false); use KIND_CPU or a CUDA build of torch"
            )
        count = torch.cuda.device_count()
        if instance.device.index >= count:
            raise ConfigError(
                f"model '{spec.name}': instance '{instance.name}' asks for GPU {instance.device.index}, "
                f"but torch sees {count} CUDA device(s)"
            )
        return torch.device("cuda", instance.device.index)

    def _map_inputs(self, module) -> None:  # type: ignore[no-untyped-def]
        torch = self._torch
        model = self.model.name
        try:
            schema = module.forward.schema
        except AttributeError:
            raise ConfigError(f"model '{model}': the TorchScript module has no forward() method") from None
        args = list(schema.arguments)[1:]  # without self
        arg_names = [a.name for a in args]
        config_inputs = list(self.model.inputs) + list(self.model.filled_inputs)  # with batch_input targets
        # The sequence batcher's control and state inputs are forward() arguments too (Triton's
        # libtorch backend counts them); they follow the <name>__<index> rule, or match by name.
        supplied = _supplied_inputs(self.model)
        if all(n in arg_names for n in config_inputs):
            positions = {n: arg_names.index(n) for n in config_inputs}
        else:
            positions = {}
            for n in config_inputs:
                self._place_by_index(positions, n, "input", args)
        for n in supplied:
            if n in arg_names and arg_names.index(n) not in positions.values():
                positions[n] = arg_names.index(n)
            else:
                self._place_by_index(positions, n, _supplied_kind(self.model, n), args)
        for i, a in enumerate(args):
            if i not in positions.values() and not a.has_default_value():
                raise ConfigError(
                    f"model '{model}': forward() argument '{a.name}' (position {i}) has no default and no "
                    f"config input supplies it; the config's inputs are {config_inputs}"
                    + (f" and the sequence batcher supplies {list(supplied)}" if supplied else "")
                )
        datatypes = {**{n: t.datatype for n, t in self.model.inputs.items()}, **supplied}
        for n, i in positions.items():
            kind = args[i].type
            if isinstance(kind, torch._C.OptionalType):
                kind = kind.getElementType()
            string = n in datatypes and datatypes[n].name == "BYTES"
            if string and not _is_string_list(torch, kind):
                raise ConfigError(
                    f"model '{model}': input '{n}' is TYPE_STRING, so forward() argument '{args[i].name}' must be "
                    f"List[str]; it is {args[i].type}"
                )
            if not string and not isinstance(kind, torch._C.TensorType):
                raise ConfigError(
                    f"model '{model}': forward() argument '{args[i].name}' (input '{n}') has type "
                    f"{args[i].type}; inferd passes each input as one Tensor (and a TYPE_STRING input as List[str])"
                )
        # All of forward's arguments, in order, supplied by config inputs: call
        # positionally (the fast path); otherwise by keyword, so defaults apply.
        order = sorted(positions, key=positions.__getitem__)
        self._positional = order if [positions[n] for n in order] == list(range(len(args))) else None
        self._arg_of = {n: arg_names[i] for n, i in positions.items()}
        self._string_inputs = tuple(n for n, d in datatypes.items() if d.name == "BYTES")
        # forward returning one List[str] returns a list: it is one output, not a list of results.
        returns = list(schema.returns)
        self._returns_one_list = len(returns) == 1 and _is_string_list(torch, returns[0].type)

    def _place_by_index(self, positions: dict[str, int], name: str, what: str, args: list[Any]) -> None:
        """Map ``name`` to forward()'s argument by its ``<name>__<index>`` suffix."""
        model = self.model.name
        arg_names = [a.name for a in args]
        index = convention_index(name)
        if index is None:
            raise ConfigError(
                f"model '{model}': {what} '{name}' is neither an argument of forward() ({arg_names}) nor "
                "named by the <name>__<index> convention (e.g. INPUT__0)"
            )
        if index >= len(args):
            raise ConfigError(
                f"model '{model}': {what} '{name}' names argument {index} of forward(), which takes "
                f"{len(args)} argument(s) {arg_names}"
            )
        other = next((o for o, p in positions.items() if p == index), None)
        if other is not None:
            raise ConfigError(f"model '{model}': '{other}' and '{name}' both name forward() argument {index}")
        positions[name] = index

    def _map_outputs(self) -> None:
        names = list(self.model.outputs)
        indexes = [convention_index(n) for n in names]
        if all(i is not None for i in indexes):
            mapping = dict(zip(names, indexes))
            seen: dict[int, str] = {}
            for n, i in mapping.items():
                if i in seen:
                    raise ConfigError(
                        f"model '{self.model.name}': outputs '{seen[i]}' and '{n}' both name forward() result {i}"
                    )
                seen[i] = n
        else:
            mapping = {n: i for i, n in enumerate(names)}  # Triton: the config's order
        # An implicit state's output is always named by its index (Triton's rule for state).
        states = self.model.sequence.states if self.model.sequence is not None else ()
        for s in states:
            index = convention_index(s.output)
            if index is None:
                raise ConfigError(
                    f"model '{self.model.name}': state output '{s.output}' does not follow the <name>__<index> "
                    "convention; a TorchScript model's state outputs are named by the index of forward()'s "
                    "result they are (e.g. OUTPUT_STATE__1)")
            other = next((n for n, i in mapping.items() if i == index), None)
            if other is not None:
                raise ConfigError(
                    f"model '{self.model.name}': '{other}' and state output '{s.output}' both name forward() "
                    f"result {index}")
            mapping[s.output] = index
        self._output_index: dict[str, int] = mapping  # type: ignore[assignment]
        self._output_types = {**{n: t.datatype for n, t in self.model.outputs.items()},
                              **{s.output: s.datatype for s in states}}
        dtypes = torch_dtypes()
        self._output_dtypes = {n: dtypes.get(d.name) for n, d in self._output_types.items()}

    # -- execution ---------------------------------------------------------------

    def execute(self, inputs: Sequence[dict[str, Any]], output_names: Sequence[str]) -> BatchResult:
        """The batch through the stager (backends/torch_device.py): inputs joined once onto the
        instance's device, one forward, outputs back once (or kept on the device for requests
        whose next ensemble step runs there). A request whose string inputs are not UTF-8 is
        refused on its own; the others of the batch run."""
        if self._string_inputs:
            problems = [self._undecodable(r) for r in inputs]
            if any(p is not None for p in problems):
                good = [r for r, p in zip(inputs, problems) if p is None]
                result = self._run_batch(good) if good else BatchResult([], ExecutionTimes())
                ran = iter(result.outputs)
                return BatchResult([next(ran) if p is None else p for p in problems], result.times)
        return self._run_batch(inputs)

    def _undecodable(self, request: dict[str, np.ndarray]) -> InferdError | None:
        for name in self._string_inputs:
            for i, item in enumerate(request[name].reshape(-1)):
                if isinstance(item, bytes):
                    try:
                        item.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        return InvalidArgument(
                            f"input '{name}' for model '{self.model.name}': element {i} is not UTF-8 text "
                            f"({exc.reason} at byte {exc.start}); a TorchScript model takes TYPE_STRING as "
                            "List[str], which holds UTF-8 text only"
                        )
        return None

    def _run_batch(self, inputs: Sequence[dict[str, Any]]) -> BatchResult:
        torch = self._torch
        stager = self._stager
        times = ExecutionTimes()
        t0 = time.perf_counter_ns()
        if torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)
        varlen = self.model.varlen
        # Variable-length batching joins on the host (padding, masks, ragged inputs: backends/batching.py)
        # and hands the stager one tensor per input.
        joined = join(inputs, varlen) if varlen is not None else None
        try:
            with stager.running():
                if joined is None:
                    tensors = {n: _to_strings([r[n] for r in inputs]) if n in self._string_inputs
                               else stager.batch_input([r[n] for r in inputs], self._input_dtypes[n]) for n in inputs[0]}
                else:
                    tensors = {n: _to_strings([a]) if n in self._string_inputs
                               else stager.batch_input([a], self._input_dtypes[n]) for n, a in joined.inputs.items()}
                t1 = time.perf_counter_ns()
                grad_mode = torch.inference_mode() if self._inference_mode else torch.no_grad()
                with grad_mode:
                    if self._optimized:
                        result = self._call(tensors)
                    else:
                        with torch.jit.optimized_execution(False):
                            result = self._call(tensors)
                    checked = self._outputs(result, self._rows(tensors) if self.model.batching else None)
                stager.synchronize()  # the forward's kernels are done: the infer time ends here
                t2 = time.perf_counter_ns()
                strings = {n: v for n, v in checked.items() if isinstance(v, np.ndarray)}  # List[str] results
                out = stager.outputs({n: v for n, v in checked.items() if n not in strings},
                                     keep_on_device=self._keep_on_device(inputs))
                out.update(strings)
        except InferdError:
            raise
        except Exception as exc:
            raise ModelExecutionError(f"model '{self.model.name}' failed to execute: {exc}") from exc
        if self._clean_cache:
            torch.cuda.empty_cache()
        results = split_batch(inputs, out) if joined is None else list(split(self.model.name, joined, out, varlen))
        times.input_ns = t1 - t0
        times.infer_ns = t2 - t1
        times.output_ns = time.perf_counter_ns() - t2
        if joined is None:
            return BatchResult(results, times)
        return BatchResult(results, times, joined.real_elements, joined.pad_elements)

    def _rows(self, tensors: dict[str, Any]) -> int | None:
        """The batch's rows, from an input that has a batch dimension (not a ragged or batch input)."""
        first = next((t for n, t in tensors.items() if n not in self._unbatched_inputs), None)
        if isinstance(first, list):  # a List[str] input: one string per row
            return len(first)
        return int(first.shape[0]) if first is not None and first.dim() > 0 else None

    def _keep_on_device(self, inputs: Sequence[dict[str, Any]]) -> bool:
        # Every request of the batch asked for its outputs here (an ensemble whose next steps run on
        # this device sets InferenceRequest.output_device); else they go to the host.
        device = self.tensor_device
        return all(isinstance(r, RequestInputs) and r.request.output_device == device for r in inputs)

    def _call(self, tensors: dict[str, Any]) -> Any:
        positional = self._positional
        if positional is not None and len(tensors) == len(positional):
            return self.module(*[tensors[n] for n in positional])
        return self.module(**{self._arg_of[n]: t for n, t in tensors.items()})

    def _outputs(self, result: Any, rows: int | None) -> dict[str, Any]:
        """forward()'s result checked against the config: one tensor per output, by name."""
        torch = self._torch
        model = self.model.name
        if isinstance(result, torch.Tensor) or self._returns_one_list:
            results: Sequence[Any] = (result,)
        elif isinstance(result, (tuple, list)):
            results = result
        else:
            raise ModelExecutionError(
                f"model '{model}': forward() returned {type(result).__name__}; inferd takes a Tensor, a List[str] "
                "or a tuple/list of them"
            )
        out: dict[str, Any] = {}
        for name, index in self._output_index.items():
            if index >= len(results):
                raise ModelExecutionError(
                    f"model '{model}': output '{name}' is forward() result {index}, but forward() returned "
                    f"{len(results)} result(s)"
                )
            tensor = results[index]
            if self._output_types[name].name == "BYTES":
                out[name] = self._string_output(name, index, tensor, rows)
                continue
            if not isinstance(tensor, torch.Tensor):
                raise ModelExecutionError(
                    f"model '{model}': forward() result {index} (output '{name}') is {type(tensor).__name__}, not a Tensor"
                )
            want = self._output_dtypes[name]
            if tensor.dtype != want:
                raise ModelExecutionError(
                    f"model '{model}': output '{name}' is {tensor.dtype} but the config declares "
                    f"{self._output_types[name].config} ({want})"
                )
            if rows is not None and name not in self._scattered and (tensor.dim() == 0 or tensor.shape[0] != rows):
                raise ModelExecutionError(
                    f"model '{model}': output '{name}' has shape {list(tensor.shape)}; with max_batch_size > 0 "
                    f"its first dimension must be the batch size {rows}"
                )
            out[name] = tensor
        return out

    def _string_output(self, name: str, index: int, value: Any, rows: int | None) -> np.ndarray:
        model = self.model.name
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ModelExecutionError(
                f"model '{model}': output '{name}' is TYPE_STRING, so forward() result {index} must be a List[str]; "
                f"it is {type(value).__name__}"
            )
        if rows is not None and len(value) != rows:
            raise ModelExecutionError(
                f"model '{model}': output '{name}' is a List[str] of {len(value)} strings; with max_batch_size > 0 "
                f"it must hold one string per batch row ({rows})"
            )
        out = np.empty(len(value), dtype=np.object_)
        out[:] = [v.encode("utf-8") for v in value]
        return out

    def close(self) -> None:
        del self.module
        if self._cuda:
            self._torch.cuda.empty_cache()


def _supplied_inputs(spec: ModelSpec) -> dict[str, DataType]:
    """The inputs the sequence batcher adds to each row (controls, then implicit states)."""
    policy = spec.sequence
    if policy is None:
        return {}
    out = {c.input: c.datatype for c in policy.controls}
    out.update({s.input: s.datatype for s in policy.states})
    return out


def _supplied_kind(spec: ModelSpec, name: str) -> str:
    policy = spec.sequence
    assert policy is not None
    return "control input" if any(c.input == name for c in policy.controls) else "state input"


def _check_string_shape(spec: ModelSpec, kind: str, t: TensorSpec) -> None:
    """Triton's rule: a string tensor is one List[str], so one dimension in all as the model sees it."""
    batching = spec.max_batch_size > 0
    if len(t.model_dims) + (1 if batching else 0) > 1:
        shape = f"reshape.shape {list(t.model_dims)}" if t.reshaped else f"dims {list(t.dims)}"
        valid = ("dims: [1] with reshape: { shape: [] } (one string per batch row)" if batching
                 else "dims: [n] or [-1]")
        raise ConfigError(
            f"model '{spec.name}': {kind} '{t.name}' is TYPE_STRING with {shape}"
            f"{' and max_batch_size ' + str(spec.max_batch_size) if batching else ''}; a TorchScript model takes "
            f"strings as one List[str], so the tensor must be one-dimensional as the model sees it: {valid}"
        )


def _is_string_list(torch: Any, kind: Any) -> bool:
    return isinstance(kind, torch._C.ListType) and isinstance(kind.getElementType(), torch._C.StringType)


def _to_strings(parts: Sequence[np.ndarray]) -> list[str]:
    """The requests' string input as one List[str], in batch order. Decodability was checked per
    request in execute(); str items (from in-process callers) pass as they are."""
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for part in parts for v in np.asarray(part).reshape(-1)]


def _set_interop_threads(model: str, count: int) -> None:
    global _interop_set_by
    torch = _torch()
    with _interop_lock:
        if _interop_set_by is None:
            try:
                torch.set_num_interop_threads(count)
                _interop_set_by = model
                return
            except RuntimeError:
                pass  # torch already started its inter-op pool
        current = torch.get_num_interop_threads()
        if current != count:
            log.warning(
                "model '%s': INTER_OP_THREAD_COUNT %d has no effect: torch's inter-op pool is process-wide and "
                "already has %d threads%s", model, count, current,
                f" (set by model '{_interop_set_by}')" if _interop_set_by else "",
            )


def _bool_param(model: str, params: dict[str, str], key: str, default: bool = False) -> bool:
    raw = params.get(key)
    if raw is None or raw == "":
        return default
    value = raw.lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"model '{model}': parameter '{key}' must be true or false, got '{raw}'")
