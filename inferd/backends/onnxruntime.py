"""The ONNX Runtime backend (platform ``onnxruntime_onnx``).

Session options come from the config as Triton's onnxruntime backend names
them (``parameters``: ``intra_op_thread_count``, ``inter_op_thread_count``,
``execution_mode``; ``optimization.graph.level``). Without an explicit
thread count an instance gets its share of the machine's cores, so that N
instances do not oversubscribe them.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from inferd.backends.base import (
    Backend, InstanceSpec, ModelInstance, TensorInstance, file_bytes, int_parameter, sample_inputs,
)
from inferd.backends.session_cache import discard
from inferd.config import ModelSignature, ModelSpec, SignatureTensor
from inferd.dtypes import BY_ONNX
from inferd.errors import ConfigError, InvalidArgument

log = logging.getLogger(__name__)

# Below this many output bytes per batch, binding outputs costs more (~15 us a run, measured on the
# 256-1024-256 MLP) than ONNX Runtime's own arena allocation it saves.
POOLED_OUTPUT_BYTES = 64 * 1024

# A pool thread that does not spin (allow_spinning 0, the default) is woken for every operator ONNX
# Runtime splits, which on a small model's small batches costs more than the split saves. Measured on
# the 256-1024-256 MLP, spinning off, wall time on two threads over one (median of 15 runs): 1.76x at
# one row, 1.05x at 8, 0.74x at 16, 0.67x at 32, and 1.9-2.0x the CPU throughout. So an instance of a
# model of up to LEAN_SESSION_MAX_BYTES given several threads by default (no intra_op_thread_count in
# its config) keeps a one-thread session as well, for the batches on which the threaded session does
# not save at least 1 - PARALLEL_GAIN of the wall time. The size bounds the second copy of the weights;
# a bigger model's batches gain more from threads (8 MB MLPs: 0.88x at one row, 0.68x at 8; 32 MB:
# 0.70x at one row).
LEAN_SESSION_MAX_BYTES = 4 * 2**20
PARALLEL_GAIN = 0.75
# The load's timing stops at a batch this long on one thread (it costs the load ~16x this at most).
LEAN_PROBE_MAX_NS = 2_000_000
# What the timing found, by model file (path, inode, size, mtime), threads, max_batch_size and graph level:
# the rows a one-thread session takes (0: none), for the next load of the same file. At most this many.
LEAN_ROWS_KEPT = 1024
_LEAN_ROWS: dict[tuple, int] = {}

_GRAPH_LEVELS = {
    -1: "ORT_DISABLE_ALL",
    0: "ORT_ENABLE_ALL",  # Triton's default for onnxruntime
    1: "ORT_ENABLE_EXTENDED",
    2: "ORT_ENABLE_BASIC",
}


# The two PyPI packages that install the ``onnxruntime`` module: inferd[onnx] and inferd[onnx-gpu].
ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu")


@functools.cache
def _installed_ort() -> list[str]:
    """Once per process: reading the distributions' metadata parses their METADATA files in Python
    (~4 ms holding the GIL, asked five times per load), which stalled the event loop while
    ``on_demand`` loads ran on their thread; what is installed does not change under a running server."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for dist in ORT_DISTRIBUTIONS:
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            pass
    return found


def _ort(model: str | None = None):  # type: ignore[no-untyped-def]
    """The ``onnxruntime`` module, or a ConfigError (naming ``model``) saying which extra installs it.

    ONNX Runtime is an extra: inferd[onnx] (CPU) or inferd[onnx-gpu] (CUDA, TensorRT). The two
    packages write the same module folder, so with both installed the last one wins file by file and
    the providers a model gets are whichever survived: refused rather than guessed at.
    """
    where = f"model '{model}': " if model else ""
    installed = _installed_ort()
    if len(installed) > 1:
        raise ConfigError(
            f"{where}both {' and '.join(installed)} are installed; they share one 'onnxruntime' module and "
            "overwrite each other: keep one (pip uninstall -y onnxruntime onnxruntime-gpu, then "
            "pip install 'inferd[onnx]' for CPU or 'inferd[onnx-gpu]' for NVIDIA GPUs)")
    try:
        import onnxruntime
    except ImportError as exc:
        raise ConfigError(
            f"{where}the ONNX Runtime backend (platform onnxruntime_onnx) needs ONNX Runtime, which is not "
            f"installed ({exc}); install it with: pip install 'inferd[onnx]' (CPU) or "
            "pip install 'inferd[onnx-gpu]' (NVIDIA GPUs)") from None
    return onnxruntime


def _shape(dims: Sequence[object]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in dims)


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    platform = "onnxruntime_onnx"
    default_filename = "model.onnx"
    file_suffixes = (".onnx",)
    gpu_requirement = "this onnxruntime has no CUDAExecutionProvider; install onnxruntime-gpu"

    def signature(self, model_file: Path, model_name: str) -> ModelSignature:
        try:
            path, *stat = _file_key(model_file)
        except OSError:
            return self._read_signature(model_file, model_name)
        return _signature_of(self, path, tuple(stat), model_name)

    def _read_signature(self, model_file: Path, model_name: str) -> ModelSignature:
        ort = _ort(model_name)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = 1
        session = self._session(model_file, model_name, options, ["CPUExecutionProvider"])

        def tensors(args, optional: bool = False) -> tuple[SignatureTensor, ...]:  # type: ignore[no-untyped-def]
            out = []
            for a in args:
                dtype = BY_ONNX.get(a.type)
                if dtype is None:
                    raise ConfigError(f"model '{model_name}': tensor '{a.name}' has type {a.type}, which inferd cannot serve")
                out.append(SignatureTensor(a.name, dtype, _shape(a.shape), optional))
            return tuple(out)

        # Initializers that are also graph inputs have a default a request may
        # override: they are the model's optional inputs.
        inputs = tensors(session.get_inputs()) + tensors(session.get_overridable_initializers(), optional=True)
        return ModelSignature(inputs, tensors(session.get_outputs()))

    def gpu_available(self) -> bool:
        try:
            return "CUDAExecutionProvider" in _ort().get_available_providers()
        except ConfigError:  # no usable ONNX Runtime: its models fail to load, saying why
            return False

    @staticmethod
    def _session(model_file: Path, model_name: str, options, providers):  # type: ignore[no-untyped-def]
        ort = _ort(model_name)
        path = _graph_file(model_file)
        try:
            return ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ConfigError(f"model '{model_name}': onnxruntime cannot load {path}: {exc}") from None

    def create_instance(self, spec: ModelSpec, instance: InstanceSpec) -> ModelInstance:
        return OnnxInstance(self, spec, instance)

    def ignored_optimizations(self, spec: ModelSpec, kinds: set[str]) -> list[tuple[str, str]]:
        ignored: list[tuple[str, str]] = []
        for kind in sorted(kinds):
            for item in providers_for(spec, kind, 0, _ort().get_available_providers())[1]:
                if item not in ignored:
                    ignored.append(item)
        return ignored


@functools.lru_cache(maxsize=1024)
def _signature_of(backend: OnnxRuntimeBackend, path: str, stat: tuple[int, int, int], model_name: str) -> ModelSignature:
    """A model file's signature, kept while the file is unchanged (``stat``: inode, size, mtime): reading
    it opens a second ONNX Runtime session, a few ms of the GIL per load, which an on_demand model
    evicted and loaded again would pay each time. Bounded: a repository rewritten often drops old files'."""
    return backend._read_signature(Path(path), model_name)


class OnnxInstance(TensorInstance):
    def __init__(self, backend: OnnxRuntimeBackend, spec: ModelSpec, instance: InstanceSpec) -> None:
        super().__init__(spec, instance)
        ort = _ort(spec.name)
        params = spec.parameters
        threads = int_parameter(spec.name, params, "intra_op_thread_count", instance.threads)
        level = _GRAPH_LEVELS[spec.graph_optimization_level]
        options = _options(ort, spec, threads, level)
        if instance.device.kind == "cuda":
            if not backend.gpu_available():
                raise ConfigError(
                    f"model '{spec.name}': instance '{instance.name}' asks for GPU {instance.device.index}, "
                    "but this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu on a CUDA host)"
                )
        providers = providers_for(spec, instance.device.kind, instance.device.index, ort.get_available_providers())[0]
        self.session = _build_session(backend, spec, instance, options, providers, level)
        self._input_types = {a.name: a.type for a in self.session.get_inputs()}
        self._all_outputs = [o.name for o in self.session.get_outputs()]
        self._bf16_outputs = {o.name for o in self.session.get_outputs() if o.type == "tensor(bfloat16)"}
        self._string_inputs = {n for n, t in self._input_types.items() if t == "tensor(string)"}
        self._uses_bf16 = bool(self._bf16_outputs) or "tensor(bfloat16)" in self._input_types.values()
        self._run_options = ort.RunOptions()
        # On CPU, call the C session directly: the Python wrapper's per-call
        # checks (input names, graph capture) cost ~2.5 us a run, and the data
        # plane has already checked the inputs against the config, which was
        # checked against this file at load. With a GPU provider the wrapper
        # stays: it retries on CPU when the provider fails.
        sess = getattr(self.session, "_sess", None)
        self._session_run = sess.run if sess is not None and providers == ["CPUExecutionProvider"] else self.session.run
        self._pooled_outputs = self._poolable_outputs(providers)
        self._row_bytes = sum(dtype.itemsize * math.prod(dims) for _, dtype, dims in self._pooled_outputs or ())
        # Batches of up to this many rows run on the one-thread session (:meth:`_add_lean_session`).
        self.lean_rows = 0
        if (threads > 1 and "intra_op_thread_count" not in params and providers == ["CPUExecutionProvider"]
                and spec.max_batch_size > 0 and not self._uses_bf16 and not self._string_inputs
                and all(-1 not in t.model_dims for t in spec.inputs.values())
                # zeros for every input the session takes: not a sequence's controls or states, which the
                # sequence batcher supplies (a run without them fails, and ONNX Runtime logs it as an error)
                and set(self._input_types) <= set(spec.inputs)
                and file_bytes(instance.model_file) <= LEAN_SESSION_MAX_BYTES):
            self._add_lean_session(backend, spec, instance, providers, level, threads)

    def _add_lean_session(self, backend: OnnxRuntimeBackend, spec: ModelSpec, instance: InstanceSpec,
                          providers: list, level: str, threads: int) -> None:
        """A second session of the model with one intra-op thread, for the batches on which the
        threaded one saves too little time (LEAN_SESSION_MAX_BYTES's comment): both timed at load on
        batches of 1, 2, 4, ... rows of zeros, the lean one takes every batch below the first size at
        which the threaded one's wall time is under PARALLEL_GAIN of its own; dropped if that is one row.
        What was measured is kept for the next load of the same file (an on_demand model evicted and
        loaded again): then only the session is built, or nothing where it was dropped."""
        key = (*_file_key(instance.model_file), threads, spec.max_batch_size, level)
        known = _LEAN_ROWS.get(key)
        if known == 0:
            return
        lean = _build_session(backend, spec, instance, _options(_ort(spec.name), spec, 1, level), providers, level)
        run_lean = getattr(lean, "_sess", lean).run
        self.lean_rows = self._time_lean_rows(spec, run_lean) if known is None else known
        if len(_LEAN_ROWS) >= LEAN_ROWS_KEPT:  # bounded: a repository rewritten often drops old files'
            _LEAN_ROWS.pop(next(iter(_LEAN_ROWS), None), None)
        _LEAN_ROWS[key] = self.lean_rows
        if self.lean_rows:
            self._lean_session, self._lean_run = lean, run_lean
        log.debug("model '%s' instance %s: batches of up to %d rows run on a one-thread session",
                  spec.name, instance.name, self.lean_rows)

    def _time_lean_rows(self, spec: ModelSpec, run_lean) -> int:  # type: ignore[no-untyped-def]
        """The largest batch the one-thread session ``run_lean`` is to run (:meth:`_add_lean_session`)."""
        rows, lean_rows = 1, 0
        try:
            while rows <= spec.max_batch_size:
                sample = sample_inputs(spec, rows)
                lean_ns = _wall_ns(run_lean, self._all_outputs, sample, self._run_options)
                if _wall_ns(self._session_run, self._all_outputs, sample, self._run_options) < PARALLEL_GAIN * lean_ns:
                    break
                lean_rows = rows
                if lean_ns > LEAN_PROBE_MAX_NS:  # larger batches are not timed: they keep the threads
                    break
                rows *= 2
        except Exception as exc:  # zeros the model refuses: its batches all run on the threaded session
            log.debug("model '%s': a batch of %d rows of zeros fails (%s); no one-thread session", spec.name, rows, exc)
            return 0
        return lean_rows

    def _poolable_outputs(self, providers: list) -> list[tuple[str, np.dtype, tuple[int, ...]]] | None:
        """The outputs ONNX Runtime can write into pooled buffers (IOBinding): on CPU, for a
        batching model whose outputs all have fixed dims in the config; None otherwise."""
        spec = self.model
        if (self.pool is None or providers != ["CPUExecutionProvider"] or spec.max_batch_size <= 0
                or spec.varlen is not None or self._uses_bf16 or self._string_inputs):
            return None
        out = []
        for name in self._all_outputs:
            t = spec.outputs.get(name)
            if t is None or -1 in t.model_dims or t.datatype.numpy is None or np.dtype(t.datatype.numpy).kind == "O":
                return None
            out.append((name, np.dtype(t.datatype.numpy), tuple(t.model_dims)))
        return out

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        if self._string_inputs:
            inputs = {k: _to_str(self.model.name, k, v) if k in self._string_inputs else v for k, v in inputs.items()}
        if self._uses_bf16:
            return self._run_bf16(inputs)
        # Rows, for a batching model (the only kind with a one-thread session or pooled outputs).
        rows = len(next(iter(inputs.values()))) if self.model.max_batch_size > 0 else 0
        lean = 0 < rows <= self.lean_rows
        if self._pooled_outputs is not None and rows * self._row_bytes >= POOLED_OUTPUT_BYTES:
            return self._run_into_pool(self._lean_session if lean else self.session, inputs, rows, self._pooled_outputs)
        values = (self._lean_run if lean else self._session_run)(self._all_outputs, inputs, self._run_options)
        return dict(zip(self._all_outputs, values))

    def _run_into_pool(self, session, inputs: dict[str, np.ndarray], rows: int,  # type: ignore[no-untyped-def]
                       outputs: list[tuple[str, np.dtype, tuple[int, ...]]]) -> dict[str, np.ndarray]:
        """One run of ``session`` whose outputs ONNX Runtime writes into buffers of the instance's pool."""
        assert self.pool is not None
        binding = session.io_binding()
        for name, array in inputs.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        out = {}
        for name, dtype, dims in outputs:
            buffer = self.pool.take(("output", name), dtype, (rows,) + dims, self.model.max_batch_size * math.prod(dims))
            binding.bind_output(name, "cpu", 0, dtype, buffer.shape, buffer.ctypes.data)
            out[name] = buffer
        session.run_with_iobinding(binding, self._run_options)
        return out

    def _run_bf16(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # numpy has no bfloat16 of its own: ORT takes and gives it through
        # OrtValue as 16-bit words, which we view as ml_dtypes.bfloat16.
        ort = _ort()
        from inferd.dtypes import BY_NAME

        binding = self.session.io_binding()
        for name, array in inputs.items():
            if self._input_types.get(name) == "tensor(bfloat16)":
                words = np.ascontiguousarray(array).view(np.uint16)
                value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(words, onnx_element_type=16)
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in self._all_outputs:
            binding.bind_output(name)
        self.session.run_with_iobinding(binding, self._run_options)
        bf16 = BY_NAME["BF16"].numpy
        out = {}
        for name, value in zip(self._all_outputs, binding.get_outputs()):
            if name in self._bf16_outputs:
                # numpy() refuses bfloat16: copy the words out of the OrtValue.
                count = value.tensor_size_in_bytes() // 2
                words = np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(value.data_ptr()))
                out[name] = words.copy().view(bf16).reshape(value.shape())
            else:
                out[name] = value.numpy()
        return out

    def close(self) -> None:
        # The bound run method holds the C session as much as the wrapper does: both go here, so the
        # session is destroyed on the thread that closes the instance (a scheduler's stop closes its
        # workers off the event loop) and not wherever the instance happens to be dropped last (an
        # eviction dropped it on the loop). Destroying a session joins its intra-op pool threads
        # while holding the GIL: measured 0.9 ms median, 6 ms p90 on the table model with 2 threads.
        for name in ("_session_run", "session", "_lean_run", "_lean_session"):
            self.__dict__.pop(name, None)


def _options(ort, spec: ModelSpec, threads: int, level: str):  # type: ignore[no-untyped-def]
    """An instance's session options from its config's parameters, with ``threads`` intra-op threads."""
    params = spec.parameters
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = int_parameter(spec.name, params, "inter_op_thread_count", 1)
    # onnxruntime's pool threads spin after each run by default. In a server
    # they would burn the cores the event loop and the other instances need
    # (measured: +~150 us of CPU per request on a small model); they block
    # instead unless the config asks for spinning.
    spin = params.get("allow_spinning", "0")
    if spin not in ("0", "1"):
        raise ConfigError(f"model '{spec.name}': parameter 'allow_spinning' must be 0 or 1, got '{spin}'")
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    mode = params.get("execution_mode", "0")
    if mode not in ("0", "1"):
        raise ConfigError(f"model '{spec.name}': parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), got '{mode}'")
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == "1" else ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    return options


def _graph_file(model_file: Path) -> Path:
    """The ONNX graph of a model: the file itself, or a folder's model.onnx (its weights beside it)."""
    return model_file / "model.onnx" if model_file.is_dir() else model_file


def _file_key(model_file: Path) -> tuple[str, int, int, int]:
    """The model's graph file and what says it is unchanged: path, inode, size, mtime (OSError if gone)."""
    path = _graph_file(model_file)
    st = os.stat(path)
    return str(path), st.st_ino, st.st_size, st.st_mtime_ns


def _wall_ns(run, names: list[str], inputs: dict[str, np.ndarray], options) -> int:  # type: ignore[no-untyped-def]
    """The fastest of three runs, in wall time, after one not counted."""
    run(names, inputs, options)
    best = None
    for _ in range(3):
        start = time.perf_counter_ns()
        run(names, inputs, options)
        elapsed = time.perf_counter_ns() - start
        best = elapsed if best is None else min(best, elapsed)
    assert best is not None
    return best


def _build_session(backend: OnnxRuntimeBackend, spec: ModelSpec, instance: InstanceSpec, options,  # type: ignore[no-untyped-def]
                   providers: list, level: str):
    """The instance's session; through the instance's session cache (:mod:`inferd.backends.session_cache`)
    for a CPU session that optimises: from the stored optimised model with optimisation off, or built
    from the model file (timed; stored as it builds when an earlier build was slow)."""
    cache = instance.session_cache
    if cache is None or providers != ["CPUExecutionProvider"] or level == "ORT_DISABLE_ALL":
        return backend._session(instance.model_file, spec.name, options, providers)
    ort = _ort(spec.name)
    model = _graph_file(instance.model_file)
    key = cache.key(model, instance.version_dir, level, ort.__version__)
    if key is None:
        return backend._session(instance.model_file, spec.name, options, providers)
    stored = cache.lookup(key)
    if stored is not None:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return ort.InferenceSession(str(stored), sess_options=options, providers=providers)
        except Exception as exc:  # a damaged entry: built again from the model file below
            log.warning("model '%s': the stored optimised model %s does not load (%s); building from %s",
                        spec.name, stored, exc, model)
            discard(stored)
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    staged = cache.staging(key)
    if staged is None:  # not known to be slow to build: built from the file, and timed
        start = time.thread_time_ns()
        session = backend._session(instance.model_file, spec.name, options, providers)
        cache.timed(key, time.thread_time_ns() - start)
        return session
    options.optimized_model_filepath = str(staged)
    # Saving at ORT_ENABLE_ALL warns that the file may hold this CPU's optimisations: the key has the CPU.
    severity = options.log_severity_level
    options.log_severity_level = max(severity, 3)
    try:
        session = backend._session(instance.model_file, spec.name, options, providers)
    except ConfigError:  # perhaps only the saving failed (a model over ORT format's 2 GB): without it
        discard(staged)
        options.optimized_model_filepath = ""
        options.log_severity_level = severity
        return backend._session(instance.model_file, spec.name, options, providers)
    cache.store(key, staged)
    return session


def _to_str(model: str, name: str, array: np.ndarray) -> np.ndarray:
    # onnxruntime's Python binding takes string tensors as str (it stores
    # UTF-8); BYTES arrive as bytes. Outputs come back as str, and the codec
    # encodes them to UTF-8 again.
    flat = array.reshape(-1)
    out = np.empty(flat.shape, dtype=np.object_)
    for i, item in enumerate(flat):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(
                    f"model '{model}': input '{name}' element {i} is not valid UTF-8, "
                    "which onnxruntime string tensors require"
                ) from None
        out[i] = item
    return out.reshape(array.shape)


# -- execution accelerators ----------------------------------------------------------------

# Triton's onnxruntime backend's TensorRT parameters -> the TensorRT provider's options.
_TRT_KEYS = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
    "trt_engine_cache_enable": "trt_engine_cache_enable",
    "trt_engine_cache_path": "trt_engine_cache_path",
}
_PRECISION = {"FP32": {}, "FP16": {"trt_fp16_enable": "True"}, "INT8": {"trt_int8_enable": "True"}}


def providers_for(spec: ModelSpec, kind: str, device: int, available: list[str]) -> tuple[list, list[tuple[str, str]]]:
    """The execution providers for an instance of ``kind`` ("cpu" or "cuda") from the config's
    accelerators and CUDA settings, and what is left unmapped, each with why (warned at load,
    never refused: a provider changes where an answer is computed, not the answer)."""
    opt = spec.optimization
    providers: list = []
    ignored: list[tuple[str, str]] = []
    gpu = kind == "cuda"
    cuda_options: dict[str, str | int] = {"device_id": device}
    for a in opt.accelerators:
        if a.kind == "gpu" and not gpu:
            ignored.append((a.field, "no instance of this model runs on a GPU here"))
        elif a.kind == "cpu" and gpu:
            ignored.append((a.field, "this instance runs on a GPU"))
        elif a.name == "tensorrt":
            if "TensorrtExecutionProvider" not in available:
                ignored.append((a.field, "this onnxruntime has no TensorrtExecutionProvider"))
                continue
            options: dict[str, str | int] = {"device_id": device}
            for key, value in a.parameters:
                if key == "precision_mode":
                    if value.upper() not in _PRECISION:
                        ignored.append((f"{a.field} parameter precision_mode '{value}'",
                                        f"not one of {list(_PRECISION)}"))
                        continue
                    options.update(_PRECISION[value.upper()])
                elif key in _TRT_KEYS or key.startswith("trt_"):
                    options[_TRT_KEYS.get(key, key)] = value
                else:
                    ignored.append((f"{a.field} parameter '{key}'", "the TensorRT provider has no such option"))
            providers.append(("TensorrtExecutionProvider", options))
        elif a.name == "cuda":  # its parameters are the CUDA provider's options
            cuda_options.update(dict(a.parameters))
        elif a.name == "openvino":
            if "OpenVINOExecutionProvider" not in available:
                ignored.append((a.field, "this onnxruntime has no OpenVINOExecutionProvider"))
                continue
            providers.append(("OpenVINOExecutionProvider", dict(a.parameters)))
        else:
            ignored.append((a.field, "a TensorFlow accelerator; onnxruntime has none"))
    if gpu:
        if opt.cuda.graphs:
            cuda_options["enable_cuda_graph"] = "1"
        providers.append(("CUDAExecutionProvider", cuda_options))
    cuda_fields = opt.cuda.fields()
    for field in cuda_fields:
        if not gpu:
            ignored.append((field, "no instance of this model runs on a GPU here"))
        elif field != "optimization.cuda.graphs":
            ignored.append((field, "onnxruntime's CUDA provider has no such setting"))
    if opt.gather_kernel_buffer_threshold:
        ignored.append(("optimization.gather_kernel_buffer_threshold", "inferd joins a batch on the host itself"))
    if opt.eager_batching:
        ignored.append(("optimization.eager_batching", "inferd's batcher decides when a batch runs"))
    providers.append("CPUExecutionProvider")
    return providers, ignored
