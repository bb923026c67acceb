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
from inferd.ensemble.conditions import Predicate, Route, parse_predicate, parse_route
from inferd.errors import ConfigError

@dataclass(frozen=True, slots=True)
class Step:
    index: int
    model_name: str
    model_version: int  # 0: the composing model's latest version when the request runs (config: -1)
    input_map: tuple[tuple[str, str], ...]  # (the composing model's input, ensemble tensor)
    output_map: tuple[tuple[str, str], ...]  # (the composing model's output, ensemble tensor)
    # A conditional step (``inferd.step.<i>.when`` / ``when_row``): it runs (for the request, or
    # for the rows) where the predicate holds; elsewhere each tensor it produces is taken from
    # its fallback tensor in ``otherwise`` (produced tensor, fallback tensor).
    when: Predicate | None = None
    otherwise: tuple[tuple[str, str], ...] = ()
    # A routed step (``inferd.step.<i>.route``): its model chosen per request.
    route: Route | None = None
    # Every ensemble tensor the step waits for: its inputs, its predicate's, fallbacks', route's.
    needs: tuple[str, ...] = ()

    @property
    def candidates(self) -> tuple[str, ...]:
        """The models this step may run: its model_name, and every model its route names."""
        if self.route is None:
            return (self.model_name,)
        return tuple(dict.fromkeys((self.model_name, *(m for _, m in self.route.models))))

    @property
    def plain(self) -> bool:
        """Always runs its one model (a Triton step)."""
        return self.when is None and self.route is None

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
        return {m for s in self.steps for m in s.candidates}


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
        when, otherwise, route = _rules(at, s.rules, output_map)
        for key, tensor in input_map + output_map:
            if not key or not tensor:
                raise ConfigError(f"{at}: a map entry has an empty name ('{key}' -> '{tensor}')")
        needs = tuple(dict.fromkeys(
            [t for _, t in input_map] + ([when.tensor] if when else []) + [t for _, t in otherwise]
            + ([route.by] if route is not None and route.parameter is None else [])))
        for tensor in needs:
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
        steps.append(Step(i, s.model_name, version, input_map, output_map, when, otherwise, route, needs))

    for step in steps:
        _check_rule_tensors(where, step, producer, inputs)
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
        needed = {tensor for tensor in step.needs if tensor not in inputs}
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


def _rules(at: str, rules: dict[str, str], output_map: tuple[tuple[str, str], ...]
           ) -> tuple[Predicate | None, tuple[tuple[str, str], ...], Route | None]:
    """A step's ``inferd.step.<i>.*`` parameters, parsed and checked against each other."""
    if "when" in rules and "when_row" in rules:
        raise ConfigError(f"{at}: give 'when' (the whole request) or 'when_row' (each row), not both")
    text = rules.get("when") or rules.get("when_row")
    when = parse_predicate(text, "when_row" in rules, at) if text else None
    otherwise: list[tuple[str, str]] = []
    if "otherwise" in rules:
        if when is None:
            raise ConfigError(f"{at}: 'otherwise' names fallback tensors, but the step has no 'when' or 'when_row' "
                              "predicate: it always runs")
        for part in (p.strip() for p in rules["otherwise"].split(",")):
            tensor, eq, fallback = (x.strip() for x in part.partition("="))
            if not eq or not tensor or not fallback:
                raise ConfigError(f"{at}: otherwise entry '{part}' must be TENSOR=FALLBACK (the tensor this step "
                                  "produces, and the tensor it takes where the step does not run)")
            otherwise.append((tensor, fallback))
    if when is not None:
        produced = [t for _, t in output_map]
        given = dict(otherwise)
        for tensor in given:
            if tensor not in produced:
                raise ConfigError(f"{at}: otherwise names tensor '{tensor}', which this step does not produce "
                                  f"(its outputs: {produced})")
        missing = [t for t in produced if t not in given]
        if missing:
            raise ConfigError(
                f"{at}: when the predicate '{when.text}' does not hold, no branch writes tensor(s) {missing}: give "
                f"each a fallback in 'otherwise' (e.g. '{missing[0]}=<an earlier tensor>')")
    route = None
    if "route" in rules:
        route = parse_route(rules.get("route_by", ""), rules["route"], at)
    elif "route_by" in rules:
        raise ConfigError(f"{at}: 'route_by' needs 'route' (key=model entries, e.g. 'de=model_de,*=model_en')")
    return when, tuple(otherwise), route


def _check_rule_tensors(where: str, step: Step, producer: dict[str, int], inputs: tuple[str, ...]) -> None:
    """The tensors a step's predicate, fallbacks and route read exist, and come from elsewhere."""
    at = f"{where} {step.label}"
    reads = ([(f"predicate '{step.when.text}'", step.when.tensor)] if step.when else []) + [
        (f"otherwise '{t}={f}'", f) for t, f in step.otherwise]
    if step.route is not None and step.route.parameter is None:
        reads.append((f"route_by '{step.route.by}'", step.route.by))
    for what, tensor in reads:
        if producer.get(tensor) == step.index:
            raise ConfigError(f"{at}: {what} reads tensor '{tensor}', which this step itself produces")
        if tensor not in producer and tensor not in inputs:
            known = sorted(set(inputs) | set(producer))
            raise ConfigError(f"{at}: {what} reads tensor '{tensor}', which is neither an ensemble input nor "
                              f"produced by any step (tensors: {known})")


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
    models: dict[int, ModelSpec] = {}  # per step, its model_name's spec
    candidates: dict[int, list[tuple[Step, ModelSpec]]] = {}  # per step, each model it may run
    for step in graph.steps:
        for name in step.candidates:
            one = step if name == step.model_name else replace(step, model_name=name)
            m = _check_step_model(spec, graph, one, lookup)
            candidates.setdefault(step.index, []).append((one, m))
            if name == step.model_name:
                models[step.index] = m

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
        for one, m in candidates[step.index]:
            for key, tensor in step.input_map:
                _check_consistent(
                    where, tensor, producers[tensor],
                    (f"{one.label} input '{key}'", m.inputs[key], m.max_batch_size > 0), batching,
                )
            for key, tensor in step.output_map:  # a routed step's every model gives the same outputs
                if one is not step:
                    _check_consistent(where, tensor, producers[tensor],
                                      (f"{one.label} output '{key}'", m.outputs[key], m.max_batch_size > 0), batching)
        _check_rules(where, spec, step, models[step.index], producers, batching)
    for name in graph.outputs:
        _check_consistent(where, name, producers[name], (f"ensemble output '{name}'", spec.outputs[name], False), batching)


def _check_step_model(spec: ModelSpec, graph: EnsembleGraph, step: Step,
                      lookup: Callable[[str], Composing | None]) -> ModelSpec:
    """One model a step may run, against the step's maps; its spec."""
    at = f"ensemble '{graph.name}' {step.label}"
    found = lookup(step.model_name)
    if found is None:
        raise ConfigError(f"{at}: model '{step.model_name}' is not in the model repository")
    if step.model_version and step.model_version not in found.versions:
        raise ConfigError(
            f"{at}: version {step.model_version} of model '{step.model_name}' is not loaded "
            f"(loaded versions: {sorted(found.versions)})"
        )
    m = found.spec
    if m.decoupled:
        raise ConfigError(
            f"{at}: model '{m.name}' is decoupled (model_transaction_policy.decoupled): it may answer a "
            "request with any number of responses, and an ensemble step needs exactly one"
        )
    check_step_tensors(graph.name, step, m.name, {n: t.optional for n, t in m.inputs.items()}, m.outputs)
    _check_batching(spec, step, m)
    return m


def check_step_tensors(ensemble: str, step: Step, model: str, inputs: dict[str, bool], outputs: Iterable[str]) -> None:
    """A step's maps against the tensors its model declares (``inputs``: name -> optional): every map
    entry names one of them, every input that is not optional is mapped. Needs no loaded model: the
    repository also checks a composing model's config.pbtxt so, before it loads (as Triton checks an
    ensemble's wiring against its composing models' configs)."""
    at = f"ensemble '{ensemble}' {step.label}"
    outputs = list(outputs)
    for key, tensor in step.input_map:
        if key not in inputs:
            raise ConfigError(
                f"{at}: input_map names input '{key}' (for tensor '{tensor}'), but model "
                f"'{model}' has inputs {list(inputs)}"
            )
    for key, tensor in step.output_map:
        if key not in outputs:
            raise ConfigError(
                f"{at}: output_map names output '{key}' (for tensor '{tensor}'), but model "
                f"'{model}' has outputs {outputs}"
            )
    mapped = {k for k, _ in step.input_map}
    missing = [n for n, optional in inputs.items() if n not in mapped and not optional]
    if missing:
        # Triton's words first (clients and its QA match on them), then inferd's.
        raise ConfigError(f"{at}: in ensemble {ensemble}, input {missing[0]} in model {model} is not mapped "
                          f"to any ensemble tensors; input_map does not map input(s) {missing} of model "
                          f"'{model}'")


def _elements(dims: list[int]) -> int | None:
    """Elements in a tensor of ``dims``; None while a dimension is variable."""
    n = 1
    for d in dims:
        if d < 0:
            return None
        n *= d
    return n


def _check_rules(where: str, spec: ModelSpec, step: Step, m: ModelSpec,
                 producers: dict[str, tuple[str, TensorSpec, bool]], batching: bool) -> None:
    """A conditional or routed step's tensors: types and shapes that give what the rule reads."""
    at = f"{where} {step.label}"
    when = step.when
    if when is not None:
        label, t, model_batches = producers[when.tensor]
        full = _full_shape(t, model_batches, batching)
        string = t.datatype.config == "TYPE_STRING"
        if when.is_string and not string:
            raise ConfigError(f"{at}: predicate '{when.text}' compares tensor '{when.tensor}' ({label}, "
                              f"{t.datatype.config}) with a string; compare it with a number")
        if not when.is_string and string:
            raise ConfigError(f"{at}: predicate '{when.text}' compares tensor '{when.tensor}' ({label}, TYPE_STRING) "
                              "with a number; compare it with a quoted string, e.g. == \"de\"")
        if when.per_row and not batching:
            raise ConfigError(f"{at}: 'when_row' splits a batch by rows, but the ensemble does not batch "
                              "(max_batch_size 0); use 'when' for the whole request")
        if not when.reduction:
            dims = list(t.dims) if when.per_row else full
            n = _elements(dims)
            if n is not None and n != 1:
                per = "each row of " if when.per_row else ""
                raise ConfigError(
                    f"{at}: predicate '{when.text}' reads {per}tensor '{when.tensor}' ({label}) as one value, but "
                    f"it has shape {dims}; reduce it (e.g. 'max({when.tensor}) {when.op} ...')"
                    + ("" if when.per_row or not batching else " or test each row with 'when_row'"))
        produced = dict((tensor, key) for key, tensor in step.output_map)
        for tensor, fallback in step.otherwise:
            out = m.outputs[produced[tensor]]
            _check_consistent(where, fallback, producers[fallback],
                              (f"{step.label} output '{produced[tensor]}' (otherwise '{tensor}={fallback}')", out,
                               m.max_batch_size > 0), batching)
    route = step.route
    if route is not None and route.parameter is None:
        label, t, model_batches = producers[route.by]
        dims = _full_shape(t, model_batches, batching)
        n = _elements(dims)
        if n is not None and n != 1:
            raise ConfigError(f"{at}: route_by tensor '{route.by}' ({label}) must hold one value (the key), but it "
                              f"has shape {dims}")


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
            for target in step.candidates:
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
    deps = {name: {m for s in g.steps for m in s.candidates if m in graphs and m != name}
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
