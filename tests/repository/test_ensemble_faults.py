"""Issue 47 item 7: an invalid ensemble is refused for its own fault, named as Triton's qa/L0_model_config
expects (a composing model the repository lacks; an input of a composing model no step maps), before its
version folders or its composing models' own failures to load are looked at: Triton checks an ensemble
against its composing models' configs. Cases shaped as L0_model_config's: composing models of a backend
inferd does not have, and no version folders, as a harness that copies the configs leaves them."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from inferd.config import declared_tensors


def _io(kind: str, names: list[str]) -> str:
    return f"{kind} [ " + ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 16 ] }}' for n in names) + " ]\n"


def _plain(repo: Path, name: str, inputs: list[str], outputs: list[str]) -> None:
    (repo / name).mkdir()
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nmax_batch_size: 4\nbackend: "identity"\n' + _io("input", inputs) + _io("output", outputs))


def _ensemble(repo: Path, name: str, steps: list[tuple[str, dict[str, str], dict[str, str]]]) -> None:
    (repo / name).mkdir()
    text = f'name: "{name}"\nmax_batch_size: 2\nplatform: "ensemble"\nensemble_scheduling {{ step [\n'
    text += ",\n".join(
        f'{{ model_name: "{model}" model_version: -1 '
        + "".join(f'input_map {{ key: "{k}" value: "{v}" }} ' for k, v in ins.items())
        + "".join(f'output_map {{ key: "{k}" value: "{v}" }} ' for k, v in outs.items()) + "}"
        for model, ins, outs in steps)
    text += "\n] }\n" + _io("input", ["data"]) + _io("output", ["prob"])
    (repo / name / "config.pbtxt").write_text(text)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    repo = tmp_path_factory.mktemp("ensemble_faults")
    _plain(repo, "one_in", ["INPUT0"], ["OUTPUT0"])
    _plain(repo, "three_out", ["INPUT0", "INPUT1", "INPUT2"], ["OUTPUT0", "OUTPUT1", "OUTPUT2"])
    _plain(repo, "four_in", ["INPUT0", "INPUT1", "INPUT2", "INPUT3"], ["OUTPUT0", "OUTPUT1", "OUTPUT2", "OUTPUT3"])
    three = ("three_out", {"INPUT0": "data", "INPUT1": "data", "INPUT2": "data"},
             {"OUTPUT0": "t1", "OUTPUT1": "t2", "OUTPUT2": "t3"})
    _ensemble(repo, "ens_missing", [
        ("one_in", {"INPUT0": "data"}, {"OUTPUT0": "t4"}), three,
        ("absent", {"input1": "t1", "input2": "t2", "input3": "t3", "input4": "t4"}, {"output": "prob"})])
    _ensemble(repo, "ens_unmapped", [
        three, ("four_in", {"INPUT1": "t1", "INPUT2": "t2", "INPUT3": "t3"}, {"OUTPUT0": "prob"})])
    return repo


def test_declared_tensors_are_read_from_the_config_as_written(repo: Path) -> None:
    assert declared_tensors("one_in", repo / "one_in") == ({"INPUT0": False}, ("OUTPUT0",))
    assert declared_tensors("nowhere", repo / "nowhere") is None


def test_the_ensembles_own_fault_is_the_reason(repo: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(repo)
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=60) as answer:
        reasons = {e["name"]: e.get("reason", "") for e in json.loads(answer.read())}
    assert reasons["ens_missing"].startswith(
        "ensemble ens_missing contains models that are not available or ambiguous: absent"), reasons
    assert ("in ensemble ens_unmapped, input INPUT0 in model four_in is not mapped to any ensemble tensors"
            in reasons["ens_unmapped"]), reasons
    assert "version folder" in reasons["one_in"]  # the composing models' own faults stay theirs
