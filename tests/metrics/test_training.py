"""Perplexity, throughput, FLOPs and MFU: values checked against hand computations."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from otel_tunix import MetricsLogger, MetricsLoggerOptions
from otel_tunix.metrics import flops as fl
from otel_tunix.metrics.flops import (
    PEAK_FLOPS,
    TransformerFlops,
    count_params,
    device_key,
    measure_torch_flops,
    peak_flops,
)
from otel_tunix.metrics.training import TrainingMetrics, perplexity


def test_perplexity_is_exp_and_never_overflows():
    assert perplexity(2.0) == pytest.approx(math.exp(2.0))
    assert perplexity(np.float32(1.5)) == pytest.approx(math.exp(1.5), rel=1e-6)
    assert perplexity(torch.tensor(0.5)) == pytest.approx(math.exp(0.5))
    assert perplexity(709.0) == pytest.approx(math.exp(709.0))
    assert perplexity(1000.0) == math.inf  # math.exp(1000) raises OverflowError
    assert perplexity(math.inf) == math.inf
    assert math.isnan(perplexity(math.nan))
    assert perplexity(-math.inf) == 0.0


def test_transformer_flops_per_token_matches_the_hand_computation():
    # GPT-2 small-ish: N = 124M, L = 12, H = 12, Q = 64, T = 1024
    f = TransformerFlops(n_params=124_000_000, n_layers=12, n_heads=12, head_dim=64, seq_len=1024)
    hand = 6 * 124_000_000 + 12 * 12 * 12 * 64 * 1024  # 744e6 + 113_246_208
    assert f.per_token() == hand == 857_246_208
    assert f.per_token(training=False) == pytest.approx(hand / 3)


def test_transformer_flops_from_a_hugging_face_config():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=100)
    model = transformers.GPT2LMHeadModel(cfg)
    n = count_params(model, exclude=lambda name: "wpe" in name)
    assert n == sum(p.numel() for name, p in model.named_parameters() if "wpe" not in name)
    f = TransformerFlops.from_config(cfg, n, seq_len=32)
    assert (f.n_layers, f.n_heads, f.head_dim, f.seq_len) == (2, 4, 16, 32)
    assert f.per_token() == 6 * n + 12 * 2 * 4 * 16 * 32


def test_count_params_of_a_pytree():
    tree = {"w": np.zeros((3, 4)), "layers": [np.zeros(5), (np.zeros((2, 2)),)]}
    assert count_params(tree) == 12 + 5 + 4


def test_measured_torch_flops_of_a_matmul_and_a_training_step():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    assert measure_torch_flops(torch.matmul, a, b) == 2 * 64 * 32 * 16
    lin = torch.nn.Linear(32, 16, bias=False)
    x = torch.randn(64, 32, requires_grad=True)  # an activation, as inside a network

    def step() -> None:
        lin(x).sum().backward()

    # forward 2·B·in·out, backward twice that (grad of input + grad of weight): 6·N·tokens
    assert measure_torch_flops(step) == 6 * (32 * 16) * 64


def test_measured_jax_flops_of_a_matmul():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    assert fl.measure_jax_flops(jnp.matmul, a, b) == pytest.approx(2 * 64 * 32 * 16, rel=0.05)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L40S", "l40s"),
        ("AMD Instinct MI300X", "mi300x"),
        ("TPU v4", "tpu-v4"),
        ("TPU v5 lite", "tpu-v5e"),
        ("TPU v5e", "tpu-v5e"),
        ("TPU v5p", "tpu-v5p"),
        ("TPU v5", "tpu-v5p"),
        ("TPU v6 lite", "tpu-v6e"),
        ("TPU v6e", "tpu-v6e"),
        ("NVIDIA L40", None),
        ("NVIDIA GB200", None),
        ("AMD Instinct MI300A", None),
        ("NVIDIA GeForce RTX 4090", None),
        ("cpu", None),
    ],
)
def test_device_names_map_to_the_peak_table(name, key):
    assert device_key(name) == key


def test_peak_flops_by_dtype():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989.4e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "float16") == 989.4e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", torch.float32) == 19.5e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "tf32") == 156e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp8") == 1978.9e12
    assert peak_flops("TPU v5p", "bf16") == 459e12
    assert peak_flops("TPU v4", "fp32") is None  # no reliable figure: no number
    assert peak_flops("NVIDIA B200", "fp32") is None
    assert peak_flops(None) is None
    for key, table in PEAK_FLOPS.items():
        assert table["bf16"] > 0, key


def test_throughput_tflops_and_mfu_against_a_hand_computation():
    tm = TrainingMetrics(
        flops_per_token=1e9, dtype="bf16", num_devices=8, device_name="NVIDIA H100 80GB HBM3"
    )
    m = tm.step(
        loss=2.0, learning_rate=3e-4, grad_norm=1.25, samples=64, tokens=64 * 2048,
        step_time_sec=0.5,
    )  # fmt: skip
    flops = 1e9 * 64 * 2048  # 1.31072e14 per step, all devices
    assert m["loss"] == 2.0 and m["perplexity"] == pytest.approx(math.exp(2.0))
    assert m["learning_rate"] == 3e-4 and m["grad_norm"] == 1.25
    assert m["step_time_sec"] == 0.5 and m["steps_per_sec"] == 2.0
    assert m["samples_per_sec"] == 128.0
    assert m["tokens_per_sec"] == 64 * 2048 * 2
    assert m["tflops_per_step"] == pytest.approx(flops / 1e12) == pytest.approx(131.072)
    per_device = flops / 0.5 / 8  # 3.2768e13 FLOP/s
    assert m["tflops_per_sec"] == pytest.approx(32.768)
    assert m["mfu"] == pytest.approx(per_device / 989.4e12) == pytest.approx(0.033119, rel=1e-4)


def test_measured_flops_per_step_and_a_peak_override():
    tm = TrainingMetrics(flops_per_step=4e12, peak_flops_per_device=100e12)
    m = tm.step(tokens=1000, step_time_sec=0.1)
    assert m["tflops_per_step"] == 4.0
    assert m["mfu"] == pytest.approx(4e12 / 0.1 / 100e12) == pytest.approx(0.4)


def test_step_time_from_the_interval_between_calls():
    tm = TrainingMetrics()
    assert "step_time_sec" not in tm.step(samples=4)  # no clock yet: throughput left out
    tm.start()
    import time

    time.sleep(0.05)
    m = tm.step(samples=4)
    assert 0.045 <= m["step_time_sec"] < 0.5
    assert m["samples_per_sec"] == pytest.approx(4 / m["step_time_sec"])


def test_unknown_device_leaves_mfu_out_with_one_warning(caplog):
    caplog.set_level(logging.WARNING, logger="otel_tunix.metrics.training")
    for _ in range(2):
        tm = TrainingMetrics(flops_per_token=1e9, device_name="NVIDIA GeForce RTX 4090")
        for _ in range(3):
            m = tm.step(tokens=1000, step_time_sec=0.1)
            assert "mfu" not in m and m["tflops_per_sec"] == pytest.approx(10.0)  # 1e9·1000/0.1
    warnings = [r for r in caplog.records if "MFU left out" in r.getMessage()]
    assert len(warnings) == 1


def test_cpu_run_detects_no_device_and_omits_mfu(caplog):
    caplog.set_level(logging.WARNING, logger="otel_tunix.metrics.training")
    assert fl.detect_device_name() is None  # CPU machine: torch has no CUDA, no NVML driver
    m = TrainingMetrics(flops_per_token=10.0).step(tokens=10, step_time_sec=1.0)
    assert "mfu" not in m
    assert sum("MFU left out" in r.getMessage() for r in caplog.records) == 1


def test_log_writes_to_the_metrics_logger_and_never_raises():
    got: list = []

    class Backend:
        def log_scalar(self, event, value, **kw):
            got.append((event, value, kw.get("step")))

        def close(self):
            pass

    logger = MetricsLogger(
        MetricsLoggerOptions(default_backends=False, backend_factories=[Backend]), rank=0
    )
    tm = TrainingMetrics(peak_flops_per_device=1e12, flops_per_token=1e6)
    out = tm.log(7, logger=logger, loss=1.0, tokens=100, step_time_sec=1.0)
    assert logger.flush()  # the test's own backend runs on a thread of its own
    assert ("mfu", pytest.approx(1e8 / 1e12), 7) in got
    assert out["perplexity"] == pytest.approx(math.e)
    assert tm.log(8, logger=logger, loss="not a number") == {}
