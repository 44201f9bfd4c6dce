"""Stragglers named during the run: the comparison itself, and real ranks under
``torchrun --standalone --nproc-per-node 3`` (gloo, CPU) with one slow rank."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from processes import child_env

from otel_tunix.consumers.stragglers import RankWindow, compare


def _window(rank: int, step_sec: float, forward: float) -> RankWindow:
    return RankWindow(rank, 0, 4, step_sec, {"forward": forward, "train_data_load": 0.002})


def test_compare_names_the_slow_rank_and_the_component_that_grew() -> None:
    windows = [_window(0, 0.010, 0.008), _window(1, 0.011, 0.008), _window(2, 0.025, 0.023)]
    v = {x.rank: x for x in compare(windows, margin=0.2)}
    assert v[2].slow and not v[0].slow and not v[1].slow
    assert v[2].relative_speed == pytest.approx(0.011 / 0.025)
    assert v[1].relative_speed == pytest.approx(1.0)
    assert v[2].grew == "forward" and v[2].grew_by_sec == pytest.approx(0.015)
    assert v[0].grew is None  # nothing above the others
    # within the margin, and within half of it: recovered
    calm = compare([_window(0, 0.010, 0.008), _window(1, 0.0109, 0.008)], margin=0.2)
    assert not any(x.slow for x in calm) and all(x.recovered for x in calm)


def test_compare_uses_own_time_when_step_times_are_synchronised() -> None:
    # every step 40 ms on every rank (a collective at the end); rank 1 computed 32 ms of it
    windows = [
        RankWindow(r, 0, 49, 0.040, {"forward": own}, own, ((7, f"{r:032x}"),))
        for r, own in enumerate([0.009, 0.032, 0.008])
    ]
    v = {x.rank: x for x in compare(windows, margin=0.2)}
    assert v[1].slow and not v[0].slow and not v[2].slow
    assert v[1].relative_speed == pytest.approx(0.009 / 0.032)
    # what goes through the store comes back the same
    assert RankWindow.from_json(windows[1].to_json()) == windows[1]
    assert RankWindow.from_json(windows[1].to_json()).slowest == ((7, f"{1:032x}"),)


RANK_SCRIPT = """
import json, os, sys, time
import torch.distributed as dist
import otel_tunix

dist.init_process_group("gloo")
rank = dist.get_rank()
otel_tunix.configure()
slow = float(os.environ["SLOW_FORWARD_MS"]) / 1e3 if rank == 2 else 0.0
step_sec = []
for n in range(40):
    t0 = time.perf_counter()
    with otel_tunix.step(n):
        with otel_tunix.component("train_data_load"):
            time.sleep(0.002)
        with otel_tunix.component("forward"):
            time.sleep(0.008 + slow)
    step_sec.append(time.perf_counter() - t0)
end_ns = time.time_ns()
dist.barrier()
otel_tunix.shutdown()
out = {"rank": rank, "step_sec": step_sec, "end_ns": end_ns}
with open(os.path.join(sys.argv[1], f"truth-{rank}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


def _torchrun_three_ranks(script_text: str, tmp_path: Path, **settings: str) -> None:
    """``script_text`` on three gloo ranks under ``torchrun --standalone`` (CPU, one thread
    each), writing to ``tmp_path/runs`` with no exporter and no system metrics, and
    ``settings`` added to the environment; fails the test if a rank fails."""
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(script_text))
    env = child_env(
        OTEL_TUNIX_OUTPUT_DIR=str(tmp_path / "runs"),
        OTEL_TUNIX_SYSTEM_METRICS_INTERVAL="0",
        OTEL_TUNIX_QUIET="true",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OMP_NUM_THREADS="1",
        **settings,
    )
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "3", str(script), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_torchrun_three_ranks_one_slow_named_during_the_run(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    _torchrun_three_ranks(
        RANK_SCRIPT,
        tmp_path,
        OTEL_TUNIX_STRAGGLER_WINDOW="5",
        OTEL_TUNIX_STRAGGLER_WINDOWS="2",
        SLOW_FORWARD_MS="15",
    )
    run_dir = tmp_path / "runs"  # one folder for the job's three ranks
    assert {p.name for p in run_dir.glob("spans-rank*.jsonl")} == {
        f"spans-rank{r}.jsonl" for r in range(3)
    }
    alerts_file = run_dir / "alerts-rank0.jsonl"  # rank 0 names the straggler
    alerts = [json.loads(line) for line in alerts_file.read_text().splitlines()]
    straggler = [a for a in alerts if a["tunix.alert.rule"] == "straggler"]
    assert straggler, alerts
    first = straggler[0]
    assert first["tunix.alert.metric"] == "rank 2"
    assert first["tunix.alert.severity"] == "warning"
    assert "forward" in first["message"]
    truth = {
        t["rank"]: t for t in (json.loads(p.read_text()) for p in tmp_path.glob("truth-*.json"))
    }
    # named during the run: after two windows of five steps, long before rank 0's loop ended
    assert first["tunix.alert.step"] == 9
    assert first["time_ns"] < truth[0]["end_ns"]
    # the slowest rank's relative speed against the ranks' own clocks around each step
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    slowest = {
        r["step"]: r["metrics"]["ranks/slowest_relative_speed"]
        for r in rows
        if "ranks/slowest_relative_speed" in r.get("metrics", {})
    }
    assert sorted(slowest)[:7] == [4, 9, 14, 19, 24, 29, 34]  # 39: if compared before exit
    for last, logged in slowest.items():
        means = sorted(
            sum(truth[r]["step_sec"][last - 4 : last + 1]) / 5 for r in range(3)
        )  # fmt: skip
        assert logged == pytest.approx(means[1] / means[2], rel=0.1)
    # the exchange's cost on rank 0: CPU time of its thread per window of five steps
    cpu = [
        r["metrics"]["ranks/exchange_cpu_sec"]
        for r in rows
        if "ranks/exchange_cpu_sec" in r.get("metrics", {})
    ]
    assert len(cpu) >= 6 and 0 < sorted(cpu)[len(cpu) // 2] < 0.05
    print(f"exchange CPU per window: median {sorted(cpu)[len(cpu) // 2] * 1e3:.3f} ms")


JAX_RANK_SCRIPT = """
import os, sys, time
import jax

rank = int(sys.argv[1])
jax.distributed.initialize(
    coordinator_address=os.environ["COORDINATOR"], num_processes=3, process_id=rank
)
import otel_tunix

otel_tunix.configure()
slow = 0.015 if rank == 2 else 0.0
for n in range(30):
    with otel_tunix.step(n):
        with otel_tunix.component("forward"):
            time.sleep(0.008 + slow)
otel_tunix.shutdown()
jax.distributed.shutdown()
"""


@pytest.mark.slow
def test_jax_multi_host_ranks_name_the_slow_one(tmp_path: Path) -> None:
    """Three JAX processes joined by jax.distributed (CPU), one slow: the ranks compare
    through JAX's coordination service and rank 0 names the straggler during the run."""
    pytest.importorskip("jax")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "jax_ranks.py"
    script.write_text(textwrap.dedent(JAX_RANK_SCRIPT))
    env = child_env(
        JAX_PLATFORMS="cpu",
        COORDINATOR=f"127.0.0.1:{port}",
        OTEL_TUNIX_RUN_ID="jax-job",  # no launcher job id: every process is told the run
        OTEL_TUNIX_OUTPUT_DIR=str(tmp_path / "run"),
        OTEL_TUNIX_STRAGGLER_WINDOW="5",
        OTEL_TUNIX_STRAGGLER_WINDOWS="2",
        OTEL_TUNIX_SYSTEM_METRICS_INTERVAL="0",
        OTEL_TUNIX_QUIET="true",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r)], env=env, stderr=subprocess.PIPE, text=True
        )
        for r in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    alerts_file = tmp_path / "run" / "alerts-rank0.jsonl"
    alerts = [json.loads(line) for line in alerts_file.read_text().splitlines()]
    straggler = [a for a in alerts if a["tunix.alert.rule"] == "straggler"]
    assert straggler and straggler[0]["tunix.alert.metric"] == "rank 2"
    assert straggler[0]["tunix.alert.step"] == 9 and "forward" in straggler[0]["message"]


SYNC_RANK_SCRIPT = """
import json, os, sys, time
import torch
import torch.distributed as dist
import otel_tunix
from otel_tunix.instrumentation import torch as ott

dist.init_process_group("gloo")
rank = dist.get_rank()
otel_tunix.configure()
own_sec = float(os.environ["BASE_MS"]) / 1e3 * (4 if rank == 2 else 1)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x):
        time.sleep(own_sec)  # the rank's own computation: four times as long on rank 2
        return self.lin(x)


model = ott.instrument_model(Model())  # also marks torch.distributed collectives blocked
opt = ott.instrument_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
x = torch.randn(4, 8)
step_sec, wait_sec = [], []
for n in range(int(os.environ["STEPS"])):
    t0 = time.perf_counter()
    with otel_tunix.step(n):
        model(x).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        t1 = time.perf_counter()
        dist.all_reduce(grads)  # data parallel: every rank waits here for the slowest
        wait_sec.append(time.perf_counter() - t1)
        opt.step()
        opt.zero_grad()
    step_sec.append(time.perf_counter() - t0)
end_ns = time.time_ns()
dist.barrier()
otel_tunix.shutdown()
out = {"rank": rank, "step_sec": step_sec, "wait_sec": wait_sec, "end_ns": end_ns}
with open(os.path.join(sys.argv[1], f"truth-{rank}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_synchronised_ranks_one_computing_4x_longer_named_with_defaults(
    tmp_path: Path,
) -> None:
    """Every step ends in an all_reduce, so every rank's step is as long as the slowest
    one's; the torch integration marks the all_reduce blocked by itself, the ranks compare
    their own time (step minus blocked) and rank 0 names rank 2 with the default settings
    (windows of 50 steps, 3 in a row), during the run, with its slowest steps' trace ids."""
    pytest.importorskip("torch.distributed")
    steps = 200
    _torchrun_three_ranks(SYNC_RANK_SCRIPT, tmp_path, BASE_MS="8", STEPS=str(steps))
    truth = {
        t["rank"]: t for t in (json.loads(p.read_text()) for p in tmp_path.glob("truth-*.json"))
    }
    # The premise, on the ranks' own clocks: synchronised steps, alike on every rank, so
    # comparing step times names no one in any window of 50 steps
    for first in range(0, steps, 50):
        by_step = [
            RankWindow(r, first, first + 49, sum(truth[r]["step_sec"][first : first + 50]) / 50, {})
            for r in range(3)
        ]  # fmt: skip
        assert not any(v.slow for v in compare(by_step, margin=0.2))
    run_dir = tmp_path / "runs"
    alerts = [
        json.loads(line) for line in (run_dir / "alerts-rank0.jsonl").read_text().splitlines()
    ]
    straggler = [a for a in alerts if a["tunix.alert.rule"] == "straggler"]
    assert straggler, alerts
    first_alert = straggler[0]
    assert first_alert["tunix.alert.metric"] == "rank 2"
    assert first_alert["tunix.alert.severity"] == "warning"
    assert "forward grew most" in first_alert["message"]
    # named during the run, at the end of the third slow window of 50 steps
    assert first_alert["tunix.alert.step"] == 149
    assert first_alert["time_ns"] < truth[0]["end_ns"]
    # the all_reduce is blocked on every rank, as long as each rank's own clock around it
    lines = {
        r: {
            d["step"]: d
            for d in map(json.loads, (run_dir / f"spans-rank{r}.jsonl").read_text().splitlines())
            if d.get("type") == "step"
        }
        for r in range(3)
    }
    for r in range(3):
        recorded = sum(lines[r][n]["components"]["all_reduce"]["blocked_time_sec"] for n in
                       range(steps))  # fmt: skip
        measured = sum(truth[r]["wait_sec"])
        assert 0.9 * measured < recorded <= measured, (r, recorded, measured)
    # peers wait for rank 2: most of their all_reduce is its extra computation
    assert sum(truth[0]["wait_sec"]) > 0.5 * 3 * 0.008 * steps
    # the alert's steps are rank 2's slowest of the window by own time, with their traces
    named = first_alert["tunix.straggler.steps"]
    assert len(named) == 3 and all(100 <= n <= 149 for n in named)
    own = {
        n: lines[2][n]["step_time_sec"] - lines[2][n]["blocked_time_sec"] for n in range(100, 150)
    }
    assert sorted(named, key=own.__getitem__, reverse=True) == named
    assert min(own[n] for n in named) >= sorted(own.values())[-3]
    assert first_alert["tunix.straggler.trace_ids"] == [lines[2][n]["trace_id"] for n in named]
    print(first_alert["message"])


def test_on_cuda_the_gpu_wait_of_a_blocked_component_is_the_time_subtracted() -> None:
    """A NCCL collective returns to the host at once and the GPU waits for the other ranks:
    here the GPU's wait is a ``torch.cuda._sleep`` inside a blocked device component. The
    host runs ahead, so the step's blocked time on the host stays small; the time the
    comparison subtracts is the GPU's wait, against the test's own CUDA events around it
    (on an H200: within 10 %)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import otel_tunix
    from otel_tunix.consumers.stragglers import _blocked_sec
    from otel_tunix.instrumentation import torch as ott
    from otel_tunix.testing import capture

    x = torch.randn(4096, 4096, device="cuda")
    cycles = 20_000_000  # about 10-20 ms of spinning, depending on the clock
    waits = []
    with capture() as cap:
        for n in range(4):
            with otel_tunix.step(n):
                with ott.device_component("forward"):
                    y = x @ x
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                with ott.device_component("all_reduce", blocked=True):
                    start.record()
                    torch.cuda._sleep(cycles)  # the GPU waits; the host goes on at once
                    end.record()
                with ott.device_component("optimizer_step"):
                    x = x + 1e-6 * y
                waits.append((start, end))
                # a loop that reads its loss each step waits for the GPU there, outside any
                # component: the step's time is then the GPU's
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        cap.flush()
        summaries = list(cap.summaries)
    assert len(summaries) == 4
    for s, (start, end) in zip(summaries, waits, strict=True):
        gpu_wait = start.elapsed_time(end) / 1e3
        assert s.device_end_ns  # its components ended on the device
        assert s.blocked_time_sec < 0.5 * gpu_wait  # the host hardly saw the wait
        assert _blocked_sec(s) == pytest.approx(gpu_wait, rel=0.1, abs=5e-4)
