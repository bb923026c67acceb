"""Issue #4: the ensemble graph, checked at load. Unit tests on configs built in code:
every refusal names the ensemble, the step and the tensor."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from inferd.config import check_ensemble_config, ensemble_config, model_spec, parse_config_text
from inferd.ensemble import graph as graph_module
from inferd.ensemble.graph import Composing, check_against_models, dependents, find_cycle, load_order
from inferd.errors import ConfigError
from inferd.repository import ensembles as loader


def build_graph(config):  # type: ignore[no-untyped-def]
    """The wiring of an ensemble's ModelConfig, as the loader builds it (through its plain EnsembleConfig)."""
    return graph_module.build_graph(ensemble_config(config))


def tensors(kind: str, items) -> str:  # type: ignore[no-untyped-def]
    return "".join(f'{kind} {{ name: "{n}" data_type: {t} dims: [ {", ".join(map(str, d))} ] }}\n'
                   for n, t, d in items)


def step(model: str, inputs: dict, outputs: dict, version: int = -1) -> str:
    text = f'step {{ model_name: "{model}" model_version: {version}\n'
    text += "".join(f'  input_map {{ key: "{k}" value: "{v}" }}\n' for k, v in inputs.items())
    text += "".join(f'  output_map {{ key: "{k}" value: "{v}" }}\n' for k, v in outputs.items())
    return text + "}\n"


FP = "TYPE_FP32"


def ensemble(steps: list[str], inputs=(("IN", FP, [4]),), outputs=(("OUT", FP, [4]),),  # type: ignore[no-untyped-def]
             max_batch_size: int = 8, extra: str = "", name: str = "ens"):
    text = f'name: "{name}" platform: "ensemble" max_batch_size: {max_batch_size}\n'
    text += tensors("input", inputs) + tensors("output", outputs) + extra
    text += "ensemble_scheduling {\n" + "".join(steps) + "}\n"
    return parse_config_text(text, model=name)


def model(name: str, inputs=(("INPUT0", FP, [4]),), outputs=(("OUTPUT0", FP, [4]),),  # type: ignore[no-untyped-def]
          max_batch_size: int = 8, extra: str = ""):
    text = f'name: "{name}" platform: "onnxruntime_onnx" max_batch_size: {max_batch_size}\n'
    return model_spec(parse_config_text(text + tensors("input", inputs) + tensors("output", outputs) + extra, model=name))


def check(config, models: dict, versions: dict | None = None) -> None:  # type: ignore[no-untyped-def]
    graph = build_graph(config)
    specs = {name: Composing(spec, frozenset((versions or {}).get(name, (1,)))) for name, spec in models.items()}
    check_against_models(model_spec(config), graph, specs.get)


def refused(fn, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        fn(*args)
    return info.value.message


A = model("a")
B = model("b")
CHAIN = [step("a", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}), step("b", {"INPUT0": "mid"}, {"OUTPUT0": "OUT"})]


# -- a valid graph --------------------------------------------------------------


def test_chain_is_accepted_and_ordered():
    config = ensemble(CHAIN)
    check_ensemble_config(config)
    graph = build_graph(config)
    check(config, {"a": A, "b": B})
    assert graph.start == (0,)
    assert graph.waits_for == (0, 1)
    assert graph.producer == {"mid": 0, "OUT": 1}
    assert graph.consumers == {"IN": (0,), "mid": (1,)}
    assert [s.model_version for s in graph.steps] == [0, 0]  # -1: latest at request time
    assert graph.sequence == (0, 1)  # a chain: the scheduler runs it step after step


def test_a_chain_listed_out_of_order_runs_in_dependency_order():
    config = ensemble(list(reversed(CHAIN)))
    assert build_graph(config).sequence == (1, 0)


def test_parallel_branches_start_together():
    config = ensemble([
        step("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}),
        step("b", {"INPUT0": "IN"}, {"OUTPUT0": "y"}),
        step("join", {"INPUT0": "x", "INPUT1": "y"}, {"OUTPUT0": "OUT"}),
    ])
    graph = build_graph(config)
    assert graph.start == (0, 1)
    assert graph.waits_for == (0, 0, 2)
    assert graph.sequence == ()  # two steps can be ready at once: no fixed sequence
    join = model("join", inputs=(("INPUT0", FP, [4]), ("INPUT1", FP, [4])))
    check(config, {"a": A, "b": B, "join": join})


def test_a_step_may_read_one_tensor_twice_and_leave_outputs_unmapped():
    two_out = model("two", inputs=(("INPUT0", FP, [4]), ("INPUT1", FP, [4])),
                    outputs=(("OUTPUT0", FP, [4]), ("OUTPUT1", FP, [4])))
    config = ensemble([step("two", {"INPUT0": "IN", "INPUT1": "IN"}, {"OUTPUT0": "OUT"})])
    graph = build_graph(config)
    assert graph.consumers == {"IN": (0,)}
    check(config, {"two": two_out})


def test_optional_inputs_need_no_mapping():
    opt = model("opt", inputs=(("INPUT0", FP, [4]), ("EXTRA", FP, [4])))
    opt.inputs["EXTRA"] = replace(opt.inputs["EXTRA"], optional=True)
    check(ensemble([step("opt", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]), {"opt": opt})


# -- the ensemble's own config ----------------------------------------------------


@pytest.mark.parametrize("extra, field", [
    ("instance_group [ { count: 1 kind: KIND_CPU } ]\n", "instance_group"),
    ('model_warmup [ { name: "w" batch_size: 1 } ]\n', "model_warmup"),
    ("optimization { graph { level: 1 } }\n", "optimization"),
    ('default_model_filename: "x.onnx"\n', "default_model_filename"),
])
def test_settings_an_ensemble_may_not_carry(extra, field):
    message = refused(check_ensemble_config, ensemble(CHAIN, extra=extra))
    assert message.startswith(f"ensemble 'ens': field '{field}' is not allowed")


def test_dynamic_batching_instead_of_ensemble_scheduling():
    config = parse_config_text('name: "ens" platform: "ensemble" max_batch_size: 8 dynamic_batching { }\n'
                               + tensors("input", [("IN", FP, [4])]) + tensors("output", [("OUT", FP, [4])]), model="ens")
    assert "field 'dynamic_batching' is not allowed" in refused(check_ensemble_config, config)


def test_ensemble_scheduling_and_inputs_are_required():
    bare = parse_config_text('name: "ens" platform: "ensemble"\n' + tensors("input", [("IN", FP, [4])])
                             + tensors("output", [("OUT", FP, [4])]), model="ens")
    assert "needs an ensemble_scheduling block" in refused(check_ensemble_config, bare)
    no_inputs = ensemble(CHAIN, inputs=())
    assert "must list the ensemble's inputs" in refused(check_ensemble_config, no_inputs)
    no_outputs = ensemble(CHAIN, outputs=())
    assert "must list the ensemble's outputs" in refused(check_ensemble_config, no_outputs)


# -- wiring ------------------------------------------------------------------------


def test_no_step():
    assert refused(build_graph, ensemble([])) == "ensemble 'ens': ensemble_scheduling lists no step"


def test_step_fields():
    assert "step 0: model_name is empty" in refused(build_graph, ensemble([step("", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]))
    message = refused(build_graph, ensemble([step("a", {}, {"OUTPUT0": "OUT"})]))
    assert message.startswith("ensemble 'ens' step 0 (model 'a'): input_map is empty")
    message = refused(build_graph, ensemble([step("a", {"INPUT0": "IN"}, {})]))
    assert message.startswith("ensemble 'ens' step 0 (model 'a'): output_map is empty")
    message = refused(build_graph, ensemble([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, version=-2)]))
    assert "model_version must be -1 (latest) or a version >= 1, got -2" in message


def test_tensor_produced_twice():
    config = ensemble([
        step("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
        step("b", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
    ])
    message = refused(build_graph, config)
    assert message == ("ensemble 'ens' step 1 (model 'b'): output 'OUTPUT0' is mapped to tensor 'OUT', which "
                       "step 0 (model 'a') already produces: a tensor may be produced only once")


def test_step_output_onto_an_ensemble_input():
    config = ensemble([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "IN"}), step("b", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    assert "output 'OUTPUT0' is mapped to 'IN', which is an ensemble input" in refused(build_graph, config)


def test_ensemble_input_no_step_consumes():
    config = ensemble(CHAIN, inputs=(("IN", FP, [4]), ("SPARE", FP, [4])))
    assert refused(build_graph, config) == "ensemble 'ens': ensemble input 'SPARE' is not consumed by any step"


def test_ensemble_output_no_step_produces():
    config = ensemble(CHAIN, outputs=(("OUT", FP, [4]), ("MISSING", FP, [4])))
    assert refused(build_graph, config) == (
        "ensemble 'ens': ensemble output 'MISSING' for ensemble 'ens' is not used: it is not produced by any step "
        "(no output_map names it)")


def test_step_reads_a_tensor_nobody_produces():
    config = ensemble([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}), step("b", {"INPUT0": "typo"}, {"OUTPUT0": "OUT"})])
    assert refused(build_graph, config) == (
        "ensemble 'ens' step 1 (model 'b'): output 'OUT' for ensemble 'ens' is not written: at least one of its "
        "depending tensors, 'typo', is not connected; input 'INPUT0' is mapped to tensor 'typo', which is neither "
        "an ensemble input nor produced by any step")


def test_cycle_inside_an_ensemble():
    join = [
        step("j", {"INPUT0": "IN", "INPUT1": "y"}, {"OUTPUT0": "x"}),
        step("k", {"INPUT0": "x"}, {"OUTPUT0": "y"}),
        step("l", {"INPUT0": "x"}, {"OUTPUT0": "OUT"}),
    ]
    message = refused(build_graph, ensemble(join))
    # The cycle feeds step 2, which writes OUT: named as Triton names an unreachable output.
    assert message.startswith("ensemble 'ens': output 'OUT' for ensemble 'ens' is not written: the steps that "
                              "would write it form a cycle: ")
    assert "step 0 (model 'j') produces 'x' for step 1 (model 'k')" in message
    assert "step 1 (model 'k') produces 'y' for step 0 (model 'j')" in message


# -- against the composing models --------------------------------------------------


def test_missing_model_and_version():
    config = ensemble(CHAIN)
    assert refused(check, config, {"a": A}) == "ensemble 'ens' step 1 (model 'b'): model 'b' is not in the model repository"
    pinned = ensemble([CHAIN[0], step("b", {"INPUT0": "mid"}, {"OUTPUT0": "OUT"}, version=3)])
    assert refused(check, pinned, {"a": A, "b": B}, {"b": (1, 2)}) == (
        "ensemble 'ens' step 1 (model 'b'): version 3 of model 'b' is not loaded (loaded versions: [1, 2])")
    check(pinned, {"a": A, "b": B}, {"b": (1, 3)})


def test_map_entries_naming_tensors_the_model_lacks():
    bad_in = ensemble([step("a", {"INPUT9": "IN"}, {"OUTPUT0": "mid"}), CHAIN[1]])
    assert refused(check, bad_in, {"a": A, "b": B}) == (
        "ensemble 'ens' step 0 (model 'a'): input_map names input 'INPUT9' (for tensor 'IN'), but model 'a' "
        "has inputs ['INPUT0']")
    bad_out = ensemble([step("a", {"INPUT0": "IN"}, {"OUTPUT7": "mid"}), CHAIN[1]])
    assert refused(check, bad_out, {"a": A, "b": B}) == (
        "ensemble 'ens' step 0 (model 'a'): output_map names output 'OUTPUT7' (for tensor 'mid'), but model 'a' "
        "has outputs ['OUTPUT0']")


def test_unmapped_model_input():
    two = model("two", inputs=(("INPUT0", FP, [4]), ("INPUT1", FP, [4])))
    config = ensemble([step("two", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})])
    assert refused(check, config, {"two": two}) == (
        "ensemble 'ens' step 0 (model 'two'): in ensemble ens, input INPUT1 in model two is not mapped to any "
        "ensemble tensors; input_map does not map input(s) ['INPUT1'] of model 'two'")


def test_data_type_mismatch():
    ints = model("b", inputs=(("INPUT0", "TYPE_INT32", [4]),))
    assert refused(check, ensemble(CHAIN), {"a": A, "b": ints}) == (
        "ensemble 'ens': tensor 'mid': data type TYPE_INT32 of step 1 (model 'b') input 'INPUT0' does not match "
        "TYPE_FP32 of step 0 (model 'a') output 'OUTPUT0'")
    # The ensemble's own declarations count too.
    config = ensemble(CHAIN, inputs=(("IN", "TYPE_FP16", [4]),))
    assert "tensor 'IN': data type TYPE_FP32 of step 0 (model 'a') input 'INPUT0' does not match TYPE_FP16 of " \
           "ensemble input 'IN'" in refused(check, config, {"a": A, "b": B})


def test_shape_mismatch_and_variable_dims():
    wide = model("b", inputs=(("INPUT0", FP, [5]),))
    assert refused(check, ensemble(CHAIN), {"a": A, "b": wide}) == (
        "ensemble 'ens': tensor 'mid': shape [5] of step 1 (model 'b') input 'INPUT0' does not match shape [4] of "
        "step 0 (model 'a') output 'OUTPUT0' (without the batch dimension)")
    rank = model("b", inputs=(("INPUT0", FP, [2, 2]),))
    assert "shape [2, 2] of step 1" in refused(check, ensemble(CHAIN), {"a": A, "b": rank})
    variable = model("b", inputs=(("INPUT0", FP, [-1]),), outputs=(("OUTPUT0", FP, [-1]),))
    check(ensemble(CHAIN), {"a": A, "b": variable})  # -1 is compatible with anything
    out_decl = ensemble(CHAIN, outputs=(("OUT", FP, [3]),))
    assert "tensor 'OUT': shape [3] of ensemble output 'OUT' does not match shape [4] of step 1 (model 'b') " \
           "output 'OUTPUT0'" in refused(check, out_decl, {"a": A, "b": B})


def test_batch_size_compatibility():
    small = model("b", max_batch_size=4)
    assert refused(check, ensemble(CHAIN, max_batch_size=8), {"a": A, "b": small}) == (
        "ensemble 'ens' step 1 (model 'b'): the ensemble's max_batch_size 8 is larger than model 'b' allows "
        "(max_batch_size 4)")
    check(ensemble(CHAIN, max_batch_size=4), {"a": A, "b": small})
    nobatch = model("b", max_batch_size=0)
    assert refused(check, ensemble(CHAIN), {"a": A, "b": nobatch}).startswith(
        "ensemble 'ens' step 1 (model 'b'): the ensemble batches (max_batch_size 8) but model 'b' does not")


def test_non_batching_ensemble_sees_the_batch_dimension():
    # A non-batching ensemble over batching models: its tensors carry the batch dimension.
    full = ensemble(CHAIN, inputs=(("IN", FP, [-1, 4]),), outputs=(("OUT", FP, [-1, 4]),), max_batch_size=0)
    check(full, {"a": A, "b": B})
    fixed = ensemble(CHAIN, inputs=(("IN", FP, [2, 4]),), outputs=(("OUT", FP, [2, 4]),), max_batch_size=0)
    check(fixed, {"a": A, "b": B})
    missing_batch = ensemble(CHAIN, max_batch_size=0)
    assert "tensor 'IN': shape [-1, 4] of step 0 (model 'a') input 'INPUT0' does not match shape [4] of ensemble " \
           "input 'IN'" in refused(check, missing_batch, {"a": A, "b": B})


# -- across ensembles ----------------------------------------------------------------


def graphs(**wiring: list[str]) -> dict:
    out = {}
    for name, models in wiring.items():
        steps, prev = [], "IN"
        for i, m in enumerate(models):
            nxt = "OUT" if i == len(models) - 1 else f"t{i}"
            steps.append(step(m, {"INPUT0": prev}, {"OUTPUT0": nxt}))
            prev = nxt
        out[name] = build_graph(ensemble(steps, name=name))
    return out


def test_self_reference():
    g = graphs(loop=["a", "loop"])
    assert find_cycle("loop", g.get) == "ensemble 'loop' step 1 names the ensemble itself: a cycle"


def test_cycle_across_nested_ensembles():
    g = graphs(outer=["a", "inner"], inner=["middle"], middle=["b", "outer"], user=["outer"], fine=["a"])
    assert find_cycle("outer", g.get) == (
        "ensembles form a cycle: ensemble 'outer' step 1 -> ensemble 'inner' step 0 -> ensemble 'middle' step 1 "
        "-> ensemble 'outer'")
    assert find_cycle("inner", g.get).startswith("ensembles form a cycle: ensemble 'inner' step 0")
    assert find_cycle("user", g.get) is None  # uses a cycle without being in it: its composing model fails
    assert find_cycle("fine", g.get) is None
    order = load_order(g)
    assert order.index("fine") < order.index("outer")
    assert set(order[-4:]) == {"outer", "inner", "middle", "user"}


def test_load_order_puts_nested_ensembles_first():
    g = graphs(top=["mid", "a"], mid=["low"], low=["a"])
    assert load_order(g) == ["low", "mid", "top"]
    assert set(dependents("a", g.values())) == {"low", "mid", "top"}
    assert set(dependents("low", g.values())) == {"mid", "top"}


# -- loading -------------------------------------------------------------------------


@dataclass
class FakeEntry:
    state: str = "READY"
    reason: str = ""
    versions: dict = field(default_factory=lambda: {1: object()})
    ensemble: object = None


def test_dependency_problem():
    g = graphs(ens=["a", "b"])["ens"]
    entries = {"a": FakeEntry(), "b": FakeEntry()}
    assert loader.dependency_problem(g, entries.get) is None
    entries["b"] = FakeEntry(state="UNAVAILABLE", reason="model 'b': bad config", versions={})
    assert loader.dependency_problem(g, entries.get) == (
        "ensemble 'ens' step 1 (model 'b'): composing model 'b' failed to load: model 'b': bad config")
    entries["b"] = FakeEntry(state="UNAVAILABLE", reason="unloaded", versions={})
    assert loader.dependency_problem(g, entries.get) == (
        "ensemble 'ens' step 1 (model 'b'): composing model 'b' is not ready: unloaded")
    del entries["b"]
    assert "model 'b' is not in the model repository" in loader.dependency_problem(g, entries.get)


def test_a_missing_model_is_named_before_another_steps_load_failure():
    """Triton's non_existing_model case: step 0's model failed, step 1's does not exist; the
    missing one is the reason, in Triton's words."""
    g = graphs(ens=["a", "b"])["ens"]
    entries = {"a": FakeEntry(state="UNAVAILABLE", reason="model 'a': bad config", versions={})}
    assert loader.dependency_problem(g, entries.get) == (
        "ensemble ens contains models that are not available or ambiguous: b (ensemble 'ens' step 1 (model 'b'): "
        "model 'b' is not in the model repository)")


def test_dependency_problem_nested():
    gs = graphs(outer=["inner"], inner=["a"])
    entries = {"a": FakeEntry(state="UNAVAILABLE", reason="unloaded", versions={}),
               "inner": FakeEntry(ensemble=loader.PreparedEnsemble(None, gs["inner"], [1]))}  # type: ignore[arg-type]
    assert loader.dependency_problem(gs["outer"], entries.get) == (
        "ensemble 'outer' step 0 (model 'inner'): composing ensemble 'inner' is not ready: ensemble 'inner' "
        "step 0 (model 'a'): composing model 'a' is not ready: unloaded")


def test_prepare_reads_versions_and_checks_everything(tmp_path: Path):
    config = ensemble(CHAIN)
    (tmp_path / "1").mkdir()
    prepared = loader.select(loader.prepare("ens", tmp_path, config), tmp_path, config)
    assert prepared.versions == [1]
    assert prepared.spec.platform == "ensemble"
    assert not prepared.spec.config.instance_group  # the manager adds none to an ensemble
    # The checks every config gets still apply (refused fields, parameters).
    per_gpu = ensemble(CHAIN, extra='cc_model_filenames { key: "7.5" value: "m.onnx" }\n')
    assert "cc_model_filenames" in refused(loader.prepare, "ens", tmp_path, per_gpu)
    typo = ensemble(CHAIN, extra='parameters { key: "inferd.nope" value { string_value: "1" } }\n')
    assert "unknown parameter 'inferd.nope'" in refused(loader.prepare, "ens", tmp_path, typo)
    # Its version folders are read after the wiring is checked against the other models (Triton's order).
    assert "no version folder" in refused(loader.select, loader.prepare("ens", tmp_path, config), tmp_path / "1", config)


def test_max_inflight_requests_is_read():
    config = ensemble(CHAIN)
    config.ensemble_scheduling.max_inflight_requests = 3
    assert build_graph(config).max_inflight_requests == 3
