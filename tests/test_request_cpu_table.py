"""bench/scenarios/request_cpu.py: the issue's table and its targets computed from one run's measures
(synthetic ones here, so every figure below follows from the inputs by hand)."""

from __future__ import annotations

import pytest

from bench.scenarios import request_cpu as rc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _m(label: str, workload: str, c: int, rate: float, cpu: float, client: float = 0.0, **kw) -> dict:
    name = label if workload == rc.IDENTITY else f"{label}: {workload}"
    return {"label": name, "workload": workload, "concurrency": c, "batch": 1, "infer_per_s": rate,
            "p50_us": kw.pop("p50", 1000.0), "p99_us": 0.0, "cpu_us": cpu, "client_cpu_us": client,
            "processes": [], "note": "", **kw}


def _result() -> dict:
    return {
        "measures": [
            _m(rc.ONE, rc.IDENTITY, 1, 1000, 500, p50=700),
            _m(rc.DEFAULT, rc.IDENTITY, 1, 900, 600, p50=850),
            _m(rc.ONE, rc.IDENTITY, 16, 3000, 300),
            _m(rc.DEFAULT, rc.IDENTITY, 16, 3200, 330),
            _m(rc.TRITON, rc.IDENTITY, 16, 4000, 100),
            _m(rc.ONE, rc.XL, 128, 2000, 900, client=100, avg_batch=60.0),
            _m(rc.DEFAULT, rc.XL, 128, 1000, 800, client=100, avg_batch=64.0),
            _m(rc.DEFAULT, "mlp", 16, 1500, 400),
            _m(rc.TRITON, "mlp", 16, 2000, 150),
        ],
        "ceilings": {f"{rc.XL} raw onnxruntime rows/s, batch 64, 2 intra-op threads, before": 3900.0,
                     f"{rc.XL} raw onnxruntime rows/s, batch 64, 2 intra-op threads, after": 4100.0},
        "raw_cpu_us_per_row": {"before": 420.0, "after": 440.0},
        "counts": {},
    }


def test_mlp_xl_is_set_against_the_mean_raw_rate_and_its_cpu_split_at_the_runtime(monkeypatch) -> None:
    monkeypatch.setattr("inferd.host.cpu_budget", lambda: 2)
    ratios = rc.ratios(_result())
    # 2,000 rows/s against the mean of 3,900 and 4,100.
    assert ratios[f"{rc.XL} c=128: {rc.ONE} rows/s / raw batch-64 (target >= 0.66x)"].startswith("0.50x (2,000 vs 4,000")
    assert ratios[f"{rc.XL} c=128: {rc.DEFAULT} rows/s / raw batch-64 (target >= 0.66x)"].startswith("0.25x")
    split = ratios[f"{rc.XL} c=128: {rc.ONE}, CPU per row"]
    # The runtime's 430 (the raw loop's mean), the request path 900 - 430; 2 cores at 2,000/s give
    # 1,000 us per row; the target rate 2,640/s would leave 758.
    assert "server 900 us (the runtime's ~430" in split and "the other ~470" in split
    assert "perf_analyzer 100 us" in split and "1,000 us per row at this rate" in split and "leaves 758" in split


def test_triton_targets_are_reported_only_where_triton_was_measured() -> None:
    ratios = rc.ratios(_result())
    assert ratios[f"identity c=16: {rc.DEFAULT} / Triton throughput (target >= 0.6x)"] == "0.80x"
    assert ratios[f"identity c=16: {rc.ONE} / Triton throughput (target >= 0.6x)"] == "0.75x"
    assert ratios[f"mlp c=16: {rc.DEFAULT} / Triton throughput (target >= 0.6x)"] == "0.75x"
    assert not any("HTTP identity" in k for k in ratios)  # no Triton figure for it
    assert ratios["identity c=1: default mode CPU per inference / one process (target <= 1.1x)"].startswith("1.20x")
    assert ratios["identity c=1: default mode p50 - one process p50 (target <= 100 us)"].startswith("+150 us")


def test_the_issue_table_has_a_column_per_server_measured_and_a_dash_for_what_was_not() -> None:
    lines = rc._issue_table(_result())
    header = next(line for line in lines if line.startswith("| |"))
    assert header == f"| | {rc.ONE} | {rc.DEFAULT} | {rc.TRITON} |"  # no echo measured
    assert f"| mlp c=16, infer/s | - | 1,500/s | 2,000/s |" in lines
    assert f"| mlp_xl c=128, CPU per inference | 900 + 100 us | 800 + 100 us | - |" in lines
    assert f"| identity p50 at c=1 | 700 us | 850 us | - |" in lines
