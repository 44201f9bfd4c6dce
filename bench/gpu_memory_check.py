"""Memory health on a real GPU: what otel-tunix records when torch's CUDA allocator has to
retry allocations and then runs out of memory (issue #39 item 6).

A tiny torch loop on CUDA, under a per-process memory cap (``--cap-mib``, default 512):

* steps 0-2 are plain;
* steps 3 and 4 each fill the allocator's cache with blocks too small to reuse, then ask
  for a larger one: the allocator frees its cache and retries (``num_alloc_retries`` grows);
* step 6 asks for more than the cap inside a component: ``torch.cuda.OutOfMemoryError``,
  caught by the loop (a skipped batch).

Then it prints, as JSON, what the run folder holds: each step's ``tunix.memory.*`` attributes
and ``tunix.profile.path``, the per-step ``memory/alloc_retries`` / ``memory/ooms`` scalars,
the ``alloc_retries_growing`` alert, the profile capture it asked for, the OOM snapshot
(``summary.json``'s ``memory_snapshots``, and the pickle's top-level keys), against the
allocator's own ``torch.cuda.memory_stats()`` totals. Exit status 0 when all of that agrees,
1 when something is missing; without CUDA it says so and exits 0 (nothing to check).

    python bench/gpu_memory_check.py [--cap-mib 512] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import otel_tunix
from otel_tunix.instrumentation import torch as ott
from otel_tunix.settings import attributes as attr

MIB = 1 << 20
RETRY_STEPS = (3, 4)
OOM_STEP = 6
STEPS = 10


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _force_retry(cap: int) -> None:
    """Fill the cache with blocks of 30 % of the cap, free them, then ask for 50 %: the
    cache cannot serve it and the cap forbids a new segment until the cache is released."""
    small = [torch.empty(int(cap * 0.3), dtype=torch.uint8, device="cuda") for _ in range(3)]
    del small
    big = torch.empty(int(cap * 0.5), dtype=torch.uint8, device="cuda")
    del big


def run(cap_mib: int, folder: Path) -> dict[str, Any]:
    total = torch.cuda.get_device_properties(0).total_memory
    cap = cap_mib * MIB
    torch.cuda.set_per_process_memory_fraction(cap / total)
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    otel_tunix.configure(output_dir=folder, system_metrics=False)
    model = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ott.instrument_optimizer(opt)  # memory read after each optimizer step
    before = torch.cuda.memory_stats()
    raised: list[int] = []
    for n in range(STEPS):
        try:
            with otel_tunix.step(n):
                with otel_tunix.component("forward"):
                    loss = model(torch.randn(64, 256, device="cuda")).square().mean()
                    if n in RETRY_STEPS:
                        _force_retry(cap)
                    if n == OOM_STEP:
                        torch.empty(cap * 2, dtype=torch.uint8, device="cuda")
                loss.backward()
                opt.step()
                opt.zero_grad()
        except torch.cuda.OutOfMemoryError:
            raised.append(n)
    after = torch.cuda.memory_stats()
    otel_tunix.shutdown()
    torch.cuda.memory._record_memory_history(enabled=None)
    ott.uninstrument_optimizer(opt)

    steps = {
        r["step"]: {k: v for k, v in r.get("attributes", {}).items() if k.startswith("tunix.")}
        for r in _read_jsonl(folder / "spans.jsonl")
        if r.get("type") == "step"
    }
    metrics = _read_jsonl(folder / "metrics.jsonl")
    scalars = {
        name: {r["step"]: r["metrics"][name] for r in metrics if name in r.get("metrics", {})}
        for name in ("memory/alloc_retries", "memory/ooms", "memory/peak_allocated_bytes")
    }
    alerts = [
        {k: a.get(k) for k in ("tunix.alert.rule", "tunix.alert.severity", "tunix.alert.step")}
        | {"profile": a.get(attr.PROFILE_PATH)}
        for a in _read_jsonl(folder / "alerts.jsonl")
    ]
    summary = json.loads((folder / "summary.json").read_text())
    snapshots = summary.get("memory_snapshots", {})
    pickles = {}
    for snap in snapshots.get("snapshots", []):
        path = folder / snap["path"]
        with open(path, "rb") as f:
            data = pickle.load(f)
        pickles[snap["path"]] = {"bytes": path.stat().st_size, "keys": sorted(data)}
    report = {
        "device": torch.cuda.get_device_name(0),
        "cap_mib": cap_mib,
        "allocator": {
            "num_alloc_retries": after["num_alloc_retries"] - before["num_alloc_retries"],
            "num_ooms": after["num_ooms"] - before["num_ooms"],
        },
        "oom_raised_in_steps": raised,
        "steps": steps,
        "scalars": scalars,
        "alerts": alerts,
        "profiles": summary.get("profiles"),
        "memory_snapshots": snapshots,
        "snapshot_files": pickles,
    }
    report["problems"] = _problems(report)
    return report


def _problems(r: dict[str, Any]) -> list[str]:
    out = []
    retries = r["scalars"]["memory/alloc_retries"]
    if sum(retries.values()) != r["allocator"]["num_alloc_retries"]:
        out.append("the per-step retries do not add up to the allocator's")
    if not any(retries.get(n, 0) > 0 for n in RETRY_STEPS):
        out.append("no retry was recorded in the retry steps")
    fired = [a for a in r["alerts"] if a["tunix.alert.rule"] == "alloc_retries_growing"]
    if not fired or fired[0]["tunix.alert.severity"] != "warning":
        out.append("alloc_retries_growing did not fire")
    if not (r["profiles"] or {}).get("captures"):
        out.append("no profile capture")
    if not r["steps"].get(OOM_STEP, {}).get(attr.MEMORY_OOM):
        out.append(f"step {OOM_STEP} is not marked {attr.MEMORY_OOM}")
    if not r["snapshot_files"]:
        out.append("no OOM snapshot written")
    elif r["steps"].get(OOM_STEP, {}).get(attr.PROFILE_PATH) not in r["snapshot_files"]:
        out.append("the OOM step does not link its snapshot")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap-mib", type=int, default=512)
    parser.add_argument("--keep", type=Path, default=None, help="run folder to keep")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    if args.keep is not None:
        report = run(args.cap_mib, args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            report = run(args.cap_mib, Path(tmp) / "run")
    print(json.dumps(report, indent=2, default=str))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
