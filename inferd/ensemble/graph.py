"""An ensemble's graph: built and checked at load, never per request.

Two layers of checks here, each usable on its own, after the config's own
(:func:`inferd.config.check_ensemble_config`: the fields an ensemble may not
carry, its input/output lists), which also gives the plain
:class:`~inferd.config.EnsembleConfig` the graph is built from:

* :func:`build_graph` - the wiring alone: steps, maps, which step produces
  and consumes each tensor, unused inputs, unproduced outputs, produced
  tensors nothing uses, tensors produced twice, cycles inside the ensemble.
* :func:`check_against_models` - the wiring against the composing models'
  specs: missing models and versions, map entries naming tensors a model
  lacks, data types and shapes between producer and consumer, batch sizes.

:func:`find_cycle` and :func:`load_order` look across ensembles (nested
ensembles, self-references). Every message names the ensemble, and the step
and tensor where there is one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from inferd.config import EnsembleConfig, ModelSpec, TensorSpec
from inferd.errors import ConfigError

@dataclass(frozen=True, slots=True)
class Step:
    index: int
    model_name: str
    model_version: int  # 0: the composing model's latest version when the request runs (config: -1)
    input_map: tuple[tuple[str, str], ...]  # (the composing model's input, ensemble tensor)
    output_map: tuple[tuple[str, str], ...]  # (the composing model's output, ensemble tensor)

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"

    @property
    def version_label(self) -> str:
        return "latest" if self.model_version == 0 else str(self.model_version)


@dataclass(frozen=True)
class EnsembleGraph:
    """The wiring of one ensemble, checked for structure."""

    name: str
    steps: tuple[Step, ...]
    inputs: tuple[str, ...]  # ensemble input tensors
    outputs: tuple[str, ...]  # ensemble output tensors
    producer: dict[str, int]  # intermediate/output tensor -> the step producing it
    consumers: dict[str, tuple[int, ...]]  # tensor -> the steps consuming it (each once)
    waits_for: tuple[int, ...]  # per step: how many distinct tensors it needs from other steps
    start: tuple[int, ...]  # steps that need only ensemble inputs
    max_inflight_requests: int  # 0: unlimited
    # The steps in order when only one can ever be ready at a time (a chain):
    # the scheduler then runs them one after another with no bookkeeping.
    # Empty when some steps can run concurrently.
    sequence: tuple[int, ...] = ()

    def composing_models(self) -> set[str]:
        return {s.model_name for s in self.steps}


# -- the ensemble's own config ---------------------------------------------------


# -- wiring ------------------------------------------------------------------------


def build_graph(config: EnsembleConfig) -> EnsembleGraph:
    """The ensemble's steps and tensors, checked for structure (no other model needed)."""
    name = config.name
    where = f"ensemble '{name}'"
    if not config.steps:
        raise ConfigError(f"{where}: ensemble_scheduling lists no step")
    inputs = config.inputs
    outputs = config.outputs
    steps: list[Step] = []
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for i, s in enumerate(config.steps):
        at = f"{where} step {i}"
        if not s.model_name:
            raise ConfigError(f"{at}: model_name is empty")
        at = f"{where} step {i} (model '{s.model_name}')"
        if s.model_namespace:
            raise ConfigError(f"{at}: model_namespace is not supported by inferd")
        if s.model_version < -1:
            raise ConfigError(f"{at}: model_version must be -1 (latest) or a version >= 1, got {s.model_version}")
        if not s.input_map:
            raise ConfigError(f"{at}: input_map is empty; a step must map its model's inputs")
        if not s.output_map:
            raise ConfigError(f"{at}: output_map is empty; a step must map at least one of its model's outputs")
        input_map = tuple(sorted(s.input_map.items()))
        output_map = tuple(sorted(s.output_map.items()))
        for key, tensor in input_map + output_map:
            if not key or not tensor:
                raise ConfigError(f"{at}: a map entry has an empty name ('{key}' -> '{tensor}')")
        for _, tensor in input_map:
            users = consumers.setdefault(tensor, [])
            if i not in users:
                users.append(i)
        for key, tensor in output_map:
            if tensor in inputs:
                raise ConfigError(
                    f"{at}: output '{key}' is mapped to '{tensor}', which is an ensemble input: "
                    f"tensor '{tensor}' would be produced twice"
                )
            if tensor in producer:
                other = steps[producer[tensor]] if producer[tensor] < len(steps) else None
                first = other.label if other else f"step {producer[tensor]}"
                raise ConfigError(
                    f"{at}: output '{key}' is mapped to tensor '{tensor}', which {first} already produces: "
                    "a tensor may be produced only once"
                )
            producer[tensor] = i
        # model_version -1 (and 0, left unset) mean the latest version at request time.
        version = int(s.model_version) if s.model_version > 0 else 0
        steps.append(Step(i, s.model_name, version, input_map, output_map))

    for tensor, users in consumers.items():
        if tensor not in producer and tensor not in inputs:
            first = steps[users[0]]
            # Triton names the ensemble output this leaves unwritten first, where there is one.
            lost = _outputs_reached(steps, consumers, outputs, users)
            unwritten = (f"output '{lost[0]}' for ensemble '{name}' is not written: at least one of its depending "
                         f"tensors, '{tensor}', is not connected; ") if lost else ""
            raise ConfigError(
                f"{where} {first.label}: {unwritten}input '{_key_for(first.input_map, tensor)}' is mapped to tensor "
                f"'{tensor}', which is neither an ensemble input nor produced by any step"
            )
    for tensor in inputs:
        if tensor not in consumers:
            raise ConfigError(f"{where}: ensemble input '{tensor}' is not consumed by any step")
    for tensor in outputs:
        if tensor not in producer:
            raise ConfigError(f"{where}: ensemble output '{tensor}' for ensemble '{name}' is not used: it is not "
                              "produced by any step (no output_map names it)")
    for tensor, i in producer.items():
        if tensor not in consumers and tensor not in outputs:
            step = steps[i]
            raise ConfigError(
                f"{where} {step.label}: output '{_key_for(step.output_map, tensor)}' is mapped to tensor "
                f"'{tensor}', which no step consumes and which is not an ensemble output; leave the output out "
                "of output_map (a step maps only the outputs the ensemble uses), or list the tensor in output"
            )

    waits_for = []
    for step in steps:
        needed = {tensor for _, tensor in step.input_map if tensor not in inputs}
        waits_for.append(len(needed))
    graph = EnsembleGraph(
        name=name,
        steps=tuple(steps),
        inputs=inputs,
        outputs=outputs,
        producer=producer,
        consumers={t: tuple(u) for t, u in consumers.items()},
        waits_for=tuple(waits_for),
        start=tuple(i for i, n in enumerate(waits_for) if n == 0),
        max_inflight_requests=config.max_inflight_requests,
    )
    order, sequential = _check_acyclic(graph)
    return replace(graph, sequence=order) if sequential else graph


def _outputs_reached(steps: list[Step], consumers: dict[str, list[int]], outputs: Any,
                     start: list[int]) -> list[str]:
    """The ensemble outputs that the steps ``start`` feed, directly or through other steps."""
    found: list[str] = []
    seen: set[int] = set()
    todo = list(start)
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        for _, tensor in steps[i].output_map:
            if tensor in outputs and tensor not in found:
                found.append(tensor)
            todo.extend(consumers.get(tensor, ()))
    return found


def _key_for(mapping: tuple[tuple[str, str], ...], tensor: str) -> str:
    return next((k for k, t in mapping if t == tensor), "?")


def _check_acyclic(graph: EnsembleGraph) -> tuple[tuple[int, ...], bool]:
    """Kahn's order over the steps, and whether no two steps were ever ready
    at once (a chain); the steps left over hold a cycle, reported as one."""
    remaining = list(graph.waits_for)
    ready = list(graph.start)
    order: list[int] = []
    sequential = True
    while ready:
        sequential = sequential and len(ready) == 1
        i = ready.pop()
        order.append(i)
        for _, tensor in graph.steps[i].output_map:
            for c in graph.consumers.get(tensor, ()):
                remaining[c] -= 1
                if remaining[c] == 0:
                    ready.append(c)
    if len(order) == len(graph.steps):
        return tuple(order), sequential
    stuck = {i for i, n in enumerate(remaining) if n > 0}
    # Walk back from a stuck step through the producers of its stuck inputs until a step repeats.
    path: list[tuple[int, str]] = []
    seen: dict[int, int] = {}
    i = min(stuck)
    while i not in seen:
        seen[i] = len(path)
        tensor = next(t for _, t in graph.steps[i].input_map if graph.producer.get(t) in stuck)
        path.append((i, tensor))
        i = graph.producer[tensor]
    cycle = path[seen[i]:]
    cycle.reverse()
    # Forward order: each step produces the tensor the next one consumes.
    parts = []
    for i, tensor in cycle:
        parts.append(f"{graph.steps[graph.producer[tensor]].label} produces '{tensor}' for {graph.steps[i].label}")
    lost = _outputs_reached(list(graph.steps), {t: list(u) for t, u in graph.consumers.items()}, graph.outputs,
                            [i for i, _ in cycle])
    unwritten = (f"output '{lost[0]}' for ensemble '{graph.name}' is not written: the steps that would write it "
                 "form a cycle: ") if lost else "the steps form a cycle: "
    raise ConfigError(f"ensemble '{graph.name}': {unwritten}" + "; ".join(parts))


# -- against the composing models ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Composing:
    """What the graph check needs to know of a composing model."""

    spec: ModelSpec
    versions: frozenset[int]


def check_against_models(
    spec: ModelSpec, graph: EnsembleGraph, lookup: Callable[[str], Composing | None]
) -> None:
    """Check ``graph`` (of the ensemble ``spec``) against its composing models.

    ``lookup(name)`` gives a loaded composing model, or None when the
    repository has none of that name.
    """
    where = f"ensemble '{graph.name}'"
    models: dict[int, ModelSpec] = {}
    for step in graph.steps:
        at = f"{where} {step.label}"
        found = lookup(step.model_name)
        if found is None:
            raise ConfigError(f"{at}: model '{step.model_name}' is not in the model repository")
        if step.model_version and step.model_version not in found.versions:
            raise ConfigError(
                f"{at}: version {step.model_version} of model '{step.model_name}' is not loaded "
                f"(loaded versions: {sorted(found.versions)})"
            )
        m = found.spec
        models[step.index] = m
        if m.decoupled:
            raise ConfigError(
                f"{at}: model '{m.name}' is decoupled (model_transaction_policy.decoupled): it may answer a "
                "request with any number of responses, and an ensemble step needs exactly one"
            )
        for key, tensor in step.input_map:
            if key not in m.inputs:
                raise ConfigError(
                    f"{at}: input_map names input '{key}' (for tensor '{tensor}'), but model "
                    f"'{m.name}' has inputs {list(m.inputs)}"
                )
        for key, tensor in step.output_map:
            if key not in m.outputs:
                raise ConfigError(
                    f"{at}: output_map names output '{key}' (for tensor '{tensor}'), but model "
                    f"'{m.name}' has outputs {list(m.outputs)}"
                )
        mapped = {k for k, _ in step.input_map}
        missing = [n for n, t in m.inputs.items() if n not in mapped and not t.optional]
        if missing:
            # Triton's words first (clients and its QA match on them), then inferd's.
            raise ConfigError(f"{at}: in ensemble {graph.name}, input {missing[0]} in model {m.name} is not mapped "
                              f"to any ensemble tensors; input_map does not map input(s) {missing} of model "
                              f"'{m.name}'")
        _check_batching(spec, step, m)

    # Every tensor: its producer against each consumer.
    batching = spec.max_batch_size > 0
    producers: dict[str, tuple[str, TensorSpec, bool]] = {}
    for name in graph.inputs:
        producers[name] = (f"ensemble input '{name}'", spec.inputs[name], False)
    for step in graph.steps:
        m = models[step.index]
        for key, tensor in step.output_map:
            producers[tensor] = (f"{step.label} output '{key}'", m.outputs[key], m.max_batch_size > 0)
    for step in graph.steps:
        m = models[step.index]
        for key, tensor in step.input_map:
            _check_consistent(
                where, tensor, producers[tensor],
                (f"{step.label} input '{key}'", m.inputs[key], m.max_batch_size > 0), batching,
            )
    for name in graph.outputs:
        _check_consistent(where, name, producers[name], (f"ensemble output '{name}'", spec.outputs[name], False), batching)


def _check_batching(spec: ModelSpec, step: Step, m: ModelSpec) -> None:
    if spec.max_batch_size == 0:
        return
    at = f"ensemble '{spec.name}' {step.label}"
    if m.max_batch_size == 0:
        raise ConfigError(
            f"{at}: the ensemble batches (max_batch_size {spec.max_batch_size}) but model '{m.name}' does not "
            "(max_batch_size 0); a batching ensemble needs batching composing models"
        )
    if spec.max_batch_size > m.max_batch_size:
        raise ConfigError(
            f"{at}: the ensemble's max_batch_size {spec.max_batch_size} is larger than model '{m.name}' "
            f"allows (max_batch_size {m.max_batch_size})"
        )


def _full_shape(t: TensorSpec, model_batches: bool, ensemble_batches: bool) -> list[int]:
    """The shape of a tensor as it travels through the ensemble.

    In a batching ensemble every step batches (checked before) and shapes are
    compared without the batch dimension; in a non-batching one a batching
    step's tensors carry the batch dimension (any size) in front.
    """
    dims = list(t.dims)
    if not ensemble_batches and model_batches:
        return [-1] + dims
    return dims


def _check_consistent(
    where: str, tensor: str, producer: tuple[str, TensorSpec, bool], consumer: tuple[str, TensorSpec, bool],
    ensemble_batches: bool,
) -> None:
    p_label, p_spec, p_batches = producer
    c_label, c_spec, c_batches = consumer
    if p_spec.datatype.config != c_spec.datatype.config:
        raise ConfigError(
            f"{where}: tensor '{tensor}': data type {c_spec.datatype.config} of {c_label} does not match "
            f"{p_spec.datatype.config} of {p_label}"
        )
    ps = _full_shape(p_spec, p_batches, ensemble_batches)
    cs = _full_shape(c_spec, c_batches, ensemble_batches)
    if len(ps) != len(cs) or any(a != b and a != -1 and b != -1 for a, b in zip(ps, cs)):
        note = " (without the batch dimension)" if ensemble_batches else ""
        raise ConfigError(
            f"{where}: tensor '{tensor}': shape {cs} of {c_label} does not match shape {ps} of {p_label}{note}"
        )


# -- across ensembles ---------------------------------------------------------------


def find_cycle(start: str, graph_of: Callable[[str], EnsembleGraph | None]) -> str | None:
    """A message describing a cycle of ensembles through ``start``, or None.

    ``graph_of(name)`` is the graph of an ensemble (None for a plain model or
    an unknown name). A step naming its own ensemble is a cycle of one.
    """
    path: list[tuple[str, Step]] = []
    on_path: set[str] = set()
    visited: set[str] = set()

    def visit(name: str) -> str | None:
        graph = graph_of(name)
        if graph is None:
            return None
        on_path.add(name)
        for step in graph.steps:
            path.append((name, step))
            target = step.model_name
            if target == start:
                return " -> ".join(f"ensemble '{n}' step {s.index}" for n, s in path) + f" -> ensemble '{start}'"
            if target not in on_path and target not in visited:
                found = visit(target)
                if found:
                    return found
            path.pop()
        on_path.discard(name)
        visited.add(name)
        return None

    chain = visit(start)
    if chain is None:
        return None
    if chain.count("->") == 1:
        return f"ensemble '{start}' step {path[0][1].index} names the ensemble itself: a cycle"
    return f"ensembles form a cycle: {chain}"


def load_order(graphs: dict[str, EnsembleGraph]) -> list[str]:
    """Ensemble names, each after the ensembles it uses; members of a cycle come last."""
    deps = {name: {s.model_name for s in g.steps if s.model_name in graphs and s.model_name != name}
            for name, g in graphs.items()}
    order: list[str] = []
    placed: set[str] = set()
    pending = sorted(graphs)
    progress = True
    while pending and progress:
        progress = False
        for name in list(pending):
            if deps[name] <= placed:
                order.append(name)
                placed.add(name)
                pending.remove(name)
                progress = True
    return order + pending


def dependents(name: str, graphs: Iterable[EnsembleGraph]) -> list[str]:
    """Ensembles that use ``name`` directly or through other ensembles."""
    graphs = list(graphs)
    found: list[str] = []
    frontier = {name}
    while frontier:
        nxt = set()
        for g in graphs:
            if g.name not in found and g.name != name and g.composing_models() & frontier:
                found.append(g.name)
                nxt.add(g.name)
        frontier = nxt
    return found
