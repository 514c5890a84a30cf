"""python -m ssd.bench gpu's memory-bandwidth bound: the bandwidth comes from the
device it runs on (its memory clock and bus width, else its datasheet row, else
none), and the result records it and where it came from. No device is needed:
torch.cuda's property and name queries are replaced by fakes; the expected
bandwidths are NVIDIA's datasheet numbers."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import ssd
from ssd.bench.gpu import add_bandwidth_bound, device_bandwidth

REPO = Path(__file__).resolve().parents[2]


def fake_device(monkeypatch, name, **props):
    """torch.cuda reports a device called `name` with properties `props`."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(name=name, **props))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


# Memory clocks (kHz) and bus widths (bits) as CUDA reports them, against the datasheets' peak bandwidths.
@pytest.mark.parametrize("name, clock_khz, bus_bits, datasheet", [
    ("NVIDIA H100 80GB HBM3", 2619000, 5120, 3.35e12),   # H100 SXM5: 3.35 TB/s
    ("NVIDIA A100-SXM4-80GB", 1593000, 5120, 2.039e12),  # A100 80GB SXM4: 2,039 GB/s
])
def test_bandwidth_from_memory_clock_and_bus_width(monkeypatch, name, clock_khz, bus_bits, datasheet):
    fake_device(monkeypatch, name, memory_clock_rate=clock_khz, memory_bus_width=bus_bits)
    bandwidth, source = device_bandwidth("cuda:0")
    assert bandwidth == pytest.approx(datasheet, rel=0.02)
    assert "memory_clock_rate" in source and str(bus_bits) in source


# A torch whose properties lack the memory clock (or report 0) falls back to the name.
@pytest.mark.parametrize("name, datasheet", [
    ("NVIDIA H100 80GB HBM3", 3.35e12),
    ("NVIDIA H100 PCIe", 2.0e12),
    ("NVIDIA H100 NVL", 3.9e12),
    ("NVIDIA H200", 4.8e12),
    ("NVIDIA A100-SXM4-40GB", 1.555e12),
    ("NVIDIA A100 80GB PCIe", 1.935e12),
])
@pytest.mark.parametrize("props", [{}, {"memory_clock_rate": 0, "memory_bus_width": 0}])
def test_bandwidth_from_datasheet_by_name(monkeypatch, name, datasheet, props):
    fake_device(monkeypatch, name, **props)
    bandwidth, source = device_bandwidth("cuda")
    assert bandwidth == pytest.approx(datasheet, rel=0.02)
    assert source == f"datasheet for {name}"


def test_unknown_device_has_no_bound(monkeypatch):
    fake_device(monkeypatch, "Some Future GPU")
    bandwidth, source = device_bandwidth("cuda:0")
    assert bandwidth is None and "Some Future GPU" in source and "--bandwidth-gbs" in source
    result = {"target_weight_bytes": 16e9, "ar": {"tok_s": 150.0}, "linear": [{"gb_s": 1600.0}]}
    line = add_bandwidth_bound(result, bandwidth, source)
    assert "no bound" in line and "%" not in line
    assert "ar_fraction_of_bound" not in result and "bandwidth_bound_tok_s" not in result
    assert "fraction_of_bandwidth" not in result["linear"][0]
    assert result["bandwidth_bytes_s"] is None and result["bandwidth_source"] == source


def test_override_wins_and_cpu_has_none(monkeypatch):
    fake_device(monkeypatch, "NVIDIA H100 80GB HBM3", memory_clock_rate=2619000, memory_bus_width=5120)
    assert device_bandwidth("cuda", override_gbs=3000.0) == (3.0e12, "--bandwidth-gbs")
    assert device_bandwidth("cpu") == (None, "cpu is not a CUDA device")


def test_bound_recorded_with_its_bandwidth():
    # A step reads 15.5 GB of weights and 0.5 GB of KV cache: 16 GB at 3.2 TB/s is 200 tok/s; 150 tok/s is
    # 75 % of it, 1600 GB/s is half of 3.2 TB/s.
    result = {"target_weight_bytes": 15.5e9, "ar": {"tok_s": 150.0, "step_bytes": 16e9},
              "linear": [{"matrix": "down", "gb_s": 1600.0}]}
    line = add_bandwidth_bound(result, 3.2e12, "datasheet for X")
    assert result["bandwidth_bound_tok_s"] == pytest.approx(200.0)
    assert result["ar_fraction_of_bound"] == pytest.approx(0.75)
    assert result["linear"][0]["fraction_of_bandwidth"] == pytest.approx(0.5)
    assert result["bandwidth_bytes_s"] == 3.2e12 and result["bandwidth_source"] == "datasheet for X"
    assert line.splitlines() == ["ar at 75% of the 200 tok/s bandwidth bound (3.20 TB/s, datasheet for X)",
                                 "linear down: 50% of the bandwidth"]


def test_bound_without_a_batch_1_ar_run():
    # ar failed: no ar bound, the products' fractions still recorded.
    result = {"linear": [{"matrix": "o", "gb_s": 320.0}]}
    line = add_bandwidth_bound(result, 3.2e12, "--bandwidth-gbs")
    assert "bandwidth_bound_tok_s" not in result and result["linear"][0]["fraction_of_bandwidth"] == pytest.approx(0.1)
    assert line.splitlines()[0] == "memory bandwidth 3.20 TB/s (--bandwidth-gbs): no batch-1 ar run to bound"


def test_bandwidth_option_must_be_positive():
    env = {**os.environ, "PYTHONPATH": str(Path(ssd.__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "ssd.bench", "gpu", "--bandwidth-gbs", "0"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 2 and "--bandwidth-gbs must be positive, got 0.0" in proc.stderr
