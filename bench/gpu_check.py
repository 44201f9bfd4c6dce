"""Checks of the metrics package on a real NVIDIA GPU (run it where one is present).

1. NVML through ``SystemMetricsSampler`` while a bf16 matmul load runs: per GPU utilization,
   memory, power, energy, temperature, SM clock, as samples and as the exported ``hw.*``
   OTel data points; torch memory stats (``framework=True``).
2. MFU of a matmul-heavy bf16 training step (a stack of square linear layers, forward and
   backward): FLOPs measured with ``FlopCounterMode`` and from ``6·N·tokens``, step time from
   ``torch.cuda.synchronize``-bracketed loops, peak from the detected device; plus a plain
   4096³ bf16 matmul for reference.
3. TTFT / TPOT of ``GenerationMetrics.generate`` with a randomly initialised GPT-2 on the GPU.

    python bench/gpu_check.py [--layers 8] [--width 8192] [--tokens 8192] [--steps 20]

Prints a human-readable report and, last, one JSON line with the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_tunix.metrics import (
    GenerationMetrics,
    SystemMetricsSampler,
    TrainingMetrics,
    measure_torch_flops,
)
from otel_tunix.metrics.flops import detect_device_name, peak_flops


def _load(stop: threading.Event) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def nvml_check() -> dict:
    reader = InMemoryMetricReader()
    sampler = SystemMetricsSampler(
        MeterProvider(metric_readers=[reader]), interval_sec=0.5, framework=True
    )
    print(f"NVML found GPUs: {sampler.has_gpus}")
    idle = sampler.sample()
    stop = threading.Event()
    t = threading.Thread(target=_load, args=(stop,), daemon=True)
    t.start()
    with sampler:
        time.sleep(3.0)
        busy = sampler.latest
    stop.set()
    t.join()
    out = {"idle": [], "busy": []}
    for label, sample in (("idle", idle), ("busy", busy)):
        for g in sample.gpus:
            row = {
                "index": g.index, "model": g.name, "utilization": g.utilization,
                "memory_used_GiB": (g.memory_used_bytes or 0) / 2**30,
                "memory_total_GiB": (g.memory_total_bytes or 0) / 2**30,
                "power_W": g.power_watts, "energy_J": g.energy_joules,
                "temperature_C": g.temperature_celsius,
                "sm_clock_MHz": None if g.sm_clock_hz is None else g.sm_clock_hz / 1e6,
            }  # fmt: skip
            out[label].append(row)
            print(f"[{label}] GPU {g.index} {g.name}: " + ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                if k not in ("index", "model")
            ))  # fmt: skip
    for m in busy.device_memory:
        print(f"[busy] {m.framework} {m.device}: allocated={m.allocated_bytes} "
              f"reserved={m.reserved_bytes} peak={m.peak_bytes}")  # fmt: skip
    data = reader.get_metrics_data()
    names = sorted({
        m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    })  # fmt: skip
    print("exported instruments:", ", ".join(names))
    out["instruments"] = names
    return out


def mfu_check(layers: int, width: int, tokens: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]
    ).to("cuda", torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        opt.step()

    measured = measure_torch_flops(step)
    n_params = sum(p.numel() for p in model.parameters())
    analytic = 6.0 * n_params * tokens
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    step_time = (time.perf_counter() - t0) / steps
    device = detect_device_name()
    tm = TrainingMetrics(flops_per_step=measured, dtype="bf16")
    m = tm.step(tokens=tokens, samples=tokens, step_time_sec=step_time)
    analytic_mfu = (
        TrainingMetrics(flops_per_token=6.0 * n_params, dtype="bf16")
        .step(tokens=tokens, step_time_sec=step_time)
        .get("mfu")
    )
    # plain matmul reference
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    reps = 200
    for _ in range(reps):
        a @ a
    torch.cuda.synchronize()
    mm = 2 * 4096**3 / ((time.perf_counter() - t0) / reps)
    res = {
        "device": device, "peak_bf16_TFLOPs": (peak_flops(device, "bf16") or 0) / 1e12,
        "params": n_params, "tokens_per_step": tokens, "step_time_ms": step_time * 1e3,
        "flops_measured": measured, "flops_6N": analytic,
        "tflops_per_sec": m.get("tflops_per_sec"), "mfu_measured_flops": m.get("mfu"),
        "mfu_6N": analytic_mfu, "matmul_4096_TFLOPs": mm / 1e12,
    }  # fmt: skip
    print(f"device {device!r}: peak bf16 {res['peak_bf16_TFLOPs']:.1f} TFLOP/s")
    print(f"step: {layers}x{width}² linear, {tokens} tokens, {step_time * 1e3:.2f} ms; "
          f"FLOPs measured {measured:.4g} vs 6N·T {analytic:.4g}")  # fmt: skip
    print(f"achieved {m.get('tflops_per_sec', 0):.1f} TFLOP/s -> MFU {m.get('mfu')} "
          f"(6N·T: {analytic_mfu}); plain 4096³ matmul {mm / 1e12:.1f} TFLOP/s")  # fmt: skip
    return res


def generation_check() -> dict:
    import transformers

    cfg = transformers.GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257,
                                  eos_token_id=50256, pad_token_id=50256)  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).to("cuda", torch.bfloat16).eval()
    gm = GenerationMetrics(model_name="gpt2-random")
    ids = torch.randint(0, 50000, (4, 512), device="cuda")
    with torch.no_grad():
        gm.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                    max_new_tokens=8, do_sample=False)  # warm-up  # fmt: skip
        gm.generate(model, input_ids=ids, attention_mask=torch.ones_like(ids),
                    max_new_tokens=64, do_sample=False)  # fmt: skip
    s = gm.stats()
    res = {"ttft_ms": s.last_ttft_sec * 1e3, "tpot_ms": (s.last_tpot_sec or 0) * 1e3,
           "e2e_ms": s.last_e2e_sec * 1e3, "tokens_per_sec": s.last_tokens_per_sec}  # fmt: skip
    print("generation (GPT-2 size, random, batch 4, prompt 512, 64 new): "
          + ", ".join(f"{k}={v:.2f}" for k, v in res.items()))  # fmt: skip
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        sys.exit(0)
    report = {"nvml": nvml_check(), "mfu": mfu_check(args.layers, args.width, args.tokens,
                                                       args.steps)}  # fmt: skip
    try:
        report["generation"] = generation_check()
    except ImportError as exc:
        print(f"generation check skipped: {exc}")
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
