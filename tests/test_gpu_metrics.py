"""GPU metrics (Triton's nv_gpu_* names and gpu_uuid label) from NVML: a fake NVML module
drives the collector, and a real server that imports the fake as ``pynvml`` serves them on
/metrics; where NVML is absent there is no GPU metric and no error."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ServerProcess
from fake_nvml.pynvml import FakeNvml
from inferd.examples import onnx_models as om
from inferd.observability.gpu_metrics import gpu_collector
from repo_builder import add_model, config

FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml"
GPU_FAMILIES = ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
                "nv_gpu_power_limit", "nv_energy_consumption")


def samples(text: str) -> dict[tuple[str, str], float]:
    """{(sample name, gpu_uuid): value} of the GPU samples in a scrape."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "gpu_uuid" in s.labels:
                out[(s.name, s.labels["gpu_uuid"])] = s.value
    return out


def scrape(collector) -> dict[tuple[str, str], float]:
    """One scrape as /metrics serves it: the gauges through prometheus_client, then the energy
    counter in Triton's own text (no ``_total``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return samples(generate_latest(registry).decode() + collector.triton_text())


def test_each_gpu_has_triton_names_units_and_uuid_label():
    nvml = FakeNvml(2)
    got = scrape(gpu_collector(nvml))
    for uuid, scale in (("GPU-fake-0000", 1), ("GPU-fake-0001", 2)):
        assert got[("nv_gpu_utilization", uuid)] == pytest.approx(0.25 * scale)  # NVML's percent as a ratio
        assert got[("nv_gpu_memory_total_bytes", uuid)] == (80 << 30) * scale
        assert got[("nv_gpu_memory_used_bytes", uuid)] == (1 << 30) * scale
        assert got[("nv_gpu_power_limit", uuid)] == 700.0  # milliwatts -> watts
    assert got[("nv_gpu_power_usage", "GPU-fake-0000")] == pytest.approx(150.5)
    assert got[("nv_gpu_power_usage", "GPU-fake-0001")] == pytest.approx(150.501)


def test_energy_counts_joules_since_the_first_reading():
    collector = gpu_collector(FakeNvml(1))
    # (prometheus_client's parser names a counter's sample ``_total`` whatever the text says)
    first = scrape(collector)[("nv_energy_consumption_total", "GPU-fake-0000")]
    second = scrape(collector)[("nv_energy_consumption_total", "GPU-fake-0000")]
    assert first == 0.0  # the server's start is the origin, as in Triton
    assert second == pytest.approx(2.5)  # the fake's 2500 mJ between readings


def test_energy_is_written_as_triton_writes_it():
    text = gpu_collector(FakeNvml(1)).triton_text()
    assert "# TYPE nv_energy_consumption counter\n" in text
    assert 'nv_energy_consumption{gpu_uuid="GPU-fake-0000"} 0.0\n' in text
    assert "_total" not in text


def test_a_reading_a_gpu_cannot_give_is_left_out_and_the_rest_stays(caplog):
    collector = gpu_collector(FakeNvml(2, unreadable={1: "power usage"}))
    for _ in range(2):
        got = scrape(collector)
    assert ("nv_gpu_power_usage", "GPU-fake-0001") not in got
    assert ("nv_gpu_power_usage", "GPU-fake-0000") in got
    assert ("nv_gpu_utilization", "GPU-fake-0001") in got
    warnings = [r for r in caplog.records if "power usage" in r.getMessage()]
    assert len(warnings) == 1 and "GPU-fake-0001" in warnings[0].getMessage()  # logged once, not per scrape


def test_only_the_gpus_the_server_sees_are_reported():
    collector = gpu_collector(FakeNvml(3), lambda: {"GPU-fake-0002"})
    assert {uuid for _, uuid in scrape(collector)} == {"GPU-fake-0002"}
    # UUIDs that match nothing NVML reports (another naming): every GPU rather than none.
    collector = gpu_collector(FakeNvml(2), lambda: {"GPU-elsewhere"})
    assert {uuid for _, uuid in scrape(collector)} == {"GPU-fake-0000", "GPU-fake-0001"}


def test_no_nvml_means_no_collector_and_no_error():
    assert gpu_collector(FakeNvml(2, init_fails=True)) is None
    assert gpu_collector(FakeNvml(0)) is None  # a driver without GPUs
    nvml = FakeNvml(2)
    nvml.unreadable = {-1: "count"}
    assert gpu_collector(nvml) is None and not nvml.initialised  # shut down again


def test_the_real_pynvml_on_a_host_without_a_driver_gives_no_collector():
    pytest.importorskip("pynvml")
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here: this host has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    assert gpu_collector() is None


def test_a_server_serves_gpu_metrics_from_nvml_on_metrics(tmp_path):
    add_model(tmp_path, "ident", om.identity(np.float32, [4], batch=False),
              config("ident", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], 0))
    path = os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")])
    server = ServerProcess(tmp_path, env={"PYTHONPATH": path, "FAKE_NVML_GPUS": "2"})
    try:
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            text = response.read().decode()
    finally:
        code = server.stop()
    assert code == 0, server.log()
    got = samples(text)
    assert {uuid for _, uuid in got} == {"GPU-fake-0000", "GPU-fake-0001"}
    for family in GPU_FAMILIES[:4]:
        assert (family, "GPU-fake-0000") in got and (family, "GPU-fake-0001") in got
    assert ("nv_gpu_power_limit", "GPU-fake-0001") not in got  # the fake's board without a limit
    assert "nv_inference_request_success" in text  # the model metrics are still there
    assert "Traceback" not in server.log()
