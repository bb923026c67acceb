"""bench/gpu_check.sh and bench/scenarios/gpu.py on a host without a GPU: the arguments, the
refusal, the dry run (models built, loadable as CPU twins, their GPU configs refused only
for want of a GPU) and RESULTS.md rendered from a sample result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import bench
from bench.scenarios import gpu

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.sh"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")


def sh(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}  # the script's python: this test's
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_the_script_explains_itself_and_refuses_unknown_arguments():
    r = sh("--help")
    assert r.returncode == 0 and "--dry-run" in r.stdout and "bench/gpu_wheels" in r.stdout
    r = sh("--frobnicate")
    assert r.returncode == 2 and "unknown argument '--frobnicate'" in r.stderr
    r = sh("--budget", "soon")
    assert r.returncode == 2 and "whole seconds" in r.stderr


@no_cuda
def test_the_scenario_refuses_a_host_without_cuda_saying_why():
    with pytest.raises(SystemExit) as info:
        gpu.run(quick=True)
    assert "needs a CUDA GPU" in str(info.value) and "--dry-run" in str(info.value)


@no_cuda
def test_the_dry_run_builds_the_models_and_checks_them_here(tmp_path):
    r = sh("--dry-run", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "wheel " in r.stdout  # the wheel folder was reported, present or missing
    report = json.loads(r.stdout[r.stdout.index("{"):])
    assert set(report["cpu_twins"]) == set(report["models"]) and len(report["models"]) == 6
    assert all(line.startswith("READY") for line in report["cpu_twins"].values()), report["cpu_twins"]
    for line in report["gpu_configs"].values():
        assert line.startswith("UNAVAILABLE") and "KIND_GPU" in line and "no GPUs are available" in line
    assert len(report["runs"]) == 14 and {c for _, _, c in report["runs"]} == {1, 16, 128}


def test_each_run_has_its_model_and_labels_are_what_ratios_look_for():
    p = gpu.Plan()
    runs = p.runs(96)
    assert {v.name for _, v, _ in runs} == {v.name for v in p.variants(96)}
    assert all(v.width == 96 for _, v, _ in runs if v.batching)
    text = gpu.config_text(p.variants(96)[1])
    assert "count: 2 kind: KIND_GPU gpus: [ 0 ]" in text and "TYPE_FP16" in text and "dynamic_batching" in text
    assert "dynamic_batching" not in gpu.config_text(p.variants(96)[-1])


def test_the_gpu_subset_is_every_module_with_gpu_marked_tests():
    files = gpu.gpu_test_files()
    assert "tests/test_gpu.py" in files and "tests/test_gpu_check.py" not in files
    marker = "pytest.mark." + "gpu"  # spelled apart, so this module is not one of them
    assert all(marker in (ROOT / f).read_text() for f in files)


def sample_result() -> dict:
    def m(label: str, c: int, ips: float) -> dict:
        return {"label": label, "concurrency": c, "batch": 1, "infer_per_s": ips, "p50_us": 1000.0,
                "p99_us": 2000.0, "rows_per_s": ips, "note": ""}

    return {
        "measures": [m("resnet FP16, 1 instance", 128, 4000.0), m("resnet FP16, 2 instances", 128, 4400.0),
                     m("resnet FP32, 1 instance", 128, 1800.0), m("resnet FP32, 1 instance", 16, 900.0),
                     m("resnet FP32, 2 instances", 16, 1200.0),
                     m("small net FP32, no batching, 1 instance", 16, 2000.0),
                     m("small net FP32, no batching, 2 instances", 16, 3100.0)],
        "ceilings": {"raw torch FP16 rows/s, batch 64": 5000.0, "raw torch FP32 rows/s, batch 64": 2000.0},
        "cuda_shm": {"identical": True, "p50_us": {"host": 900.0, "cuda_shm": 700.0}, "calls": 200},
        "tests": {"exit": 0, "summary": "9 passed in 40.1s", "passed": 9},
        "environment": {"gpu": "NVIDIA H200", "torch": "2.11.0"},
        "gpu_metrics": {"nv_gpu_utilization": {"GPU-1": 0.5}},
    }


def test_ratios_are_the_figures_the_issue_asks_for():
    r = gpu.ratios(sample_result())
    assert r["FP16 1 inst. c=128 / raw torch batch 64"].startswith("0.80x")
    assert r["FP32 1 inst. c=128 / raw torch batch 64"].startswith("0.90x")
    assert r["FP32 c=16: 2 instances / 1"] == "1.33x"
    assert r["small net c=16: 2 instances / 1 (GPU idle between launches)"].startswith("1.55x")
    assert r["CUDA shared memory results identical to the host path"].startswith("yes")
    assert r["GPU test subset (pytest -m gpu)"] == "green: 9 passed in 40.1s"
    assert "FP32 2 inst. c=128 / raw torch batch 64" not in r  # not measured: no figure invented
    skipped = dict(sample_result(), tests={"exit": 0, "summary": "10 skipped", "passed": 0, "skipped": 10})
    assert gpu.ratios(skipped)["GPU test subset (pytest -m gpu)"].startswith("NOT RUN")


def test_results_md_renders_the_gpu_result(tmp_path, monkeypatch):
    result = sample_result()
    result["ratios"] = gpu.ratios(result)
    result["notes"] = gpu.notes(result)
    data = {"scenario": "gpu", "doc": gpu.__doc__.strip(), "result": result, "when": "2026-01-01 00:00 UTC",
            "machine": "16 cores", "command": "bench/gpu_check.sh"}
    (tmp_path / "gpu.json").write_text(json.dumps(data))
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    text = bench.render()
    assert "## gpu" in text and "| resnet FP16, 1 instance | 128 | 1 | 4,000 |" in text
    assert "raw torch FP16 rows/s, batch 64: 5,000/s" in text
    assert "**FP16 1 inst. c=128 / raw torch batch 64**: 0.80x (target >= 0.8)" in text
    assert "NVIDIA H200" in text and "nv_gpu_utilization" in text
