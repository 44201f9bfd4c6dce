"""``otel-tunix goodput``: a job hard-killed and restarted, every category against the
clocks and sleeps of the test and of its child processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from processes import child_env

from otel_tunix.accounting import categories as cat
from otel_tunix.analysis.ledger import job_ledger
from otel_tunix.analysis.readers import iter_records
from otel_tunix.cli import main

JOB = "job-29"
STEP_SEC = 0.015  # train_step_compute, every step
SAVE_SEC = 0.08  # checkpoint_save, in every 50th step (the state after it)
RESTORE_SEC = 0.06  # checkpoint_restore, when resuming
INIT_SEC = 0.1  # "building the model" between configure() and the first step
GAP_SEC = 0.3  # the test waits this long between the kill and the restart
CHECKPOINT_EVERY, KILL_AT, LAST = 50, 60, 100
EPS = 0.001  # two clocks (the child's time.time_ns, the SDK's perf_counter + offset)

PROGRAM = textwrap.dedent(
    f"""
    import json, sys, time
    from otel_tunix.support.process import process_start_ns
    proc_start = process_start_ns()  # the process start, as the kernel says
    import otel_tunix

    out, first, stop, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

    def say(**kw):
        print(json.dumps(kw), flush=True)

    def timed(name, seconds, into):
        # (the sleep read inside the component, the component read around it)
        a = time.time_ns()
        with otel_tunix.component(name):
            b = time.time_ns()
            time.sleep(seconds)
            c = time.time_ns()
        into[name] = [(c - b) * 1e-9, (time.time_ns() - a) * 1e-9, a]

    def wait_for_step(n):
        # the spans file holds step n (flushed by the worker): the kill loses nothing before
        while True:
            with open(out + "/spans.jsonl", "rb") as f:
                for line in f:
                    if line.endswith(b"\\n") and json.loads(line).get("step") == n:
                        return
            time.sleep(0.005)

    cfg0 = time.time_ns()
    otel_tunix.configure(
        output_dir=out, system_metrics=False, alerts=False,
        perf=otel_tunix.PerformanceMetricsConfig(perfetto_trace_dir="none"),
    )
    say(proc_start=proc_start, cfg=[cfg0, time.time_ns()])
    time.sleep({INIT_SEC})
    if first > 0:  # resuming: the checkpoint is restored before the loop, outside any step
        restored = {{}}
        timed("checkpoint_restore", {RESTORE_SEC}, restored)
        say(restore=restored["checkpoint_restore"])
    for n in range(first, stop):
        if n == kill_at:
            with otel_tunix.step(n):
                wait_for_step(n - 1)
                say(killable=n)
                time.sleep(600)
        inner = {{}}
        t0 = time.time_ns()
        with otel_tunix.step(n):
            timed("train_step_compute", {STEP_SEC}, inner)
            if (n + 1) % {CHECKPOINT_EVERY} == 0:
                timed("checkpoint_save", {SAVE_SEC}, inner)
        say(step=n, t0=t0, t1=time.time_ns(), **inner)
    otel_tunix.shutdown()
    """
)


@dataclass
class Child:
    """What one child process said (its own clock readings, Unix ns) and the test's."""

    spawned_ns: int
    proc_start: int = 0
    cfg: tuple[int, int] = (0, 0)
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    restore: tuple[float, float, int] = (0.0, 0.0, 0)
    killed_ns: int = 0

    def read(self, lines: Iterator[str], until: str | None = None) -> None:
        for line in lines:
            msg = json.loads(line)
            if "proc_start" in msg:
                self.proc_start, self.cfg = msg["proc_start"], tuple(msg["cfg"])
            elif "restore" in msg:
                self.restore = tuple(msg["restore"])  # type: ignore[assignment]
            elif "step" in msg:
                self.steps[msg["step"]] = msg
            if until is not None and until in msg:
                return

    def first_step_start(self) -> tuple[int, int]:
        """Bracket of the first step window's start: before ``with step``, and the first
        component's start inside it."""
        s = self.steps[min(self.steps)]
        return s["t0"], min(v[2] for k, v in s.items() if isinstance(v, list))

    def start(self, header: dict[str, Any]) -> tuple[int, int]:
        """Bracket of the run's start by the ledger's rule: the process start when the
        header has it (what the child read from the same function), else configure()."""
        if "process_start_ns" in header:
            assert self.spawned_ns - 0.02e9 <= self.proc_start <= self.cfg[0]
            return self.proc_start, self.proc_start
        return self.cfg


def _spawn(out: Path, first: int, stop: int, kill_at: int) -> tuple[Any, Child]:
    # The job id only: the attempt is found in the run folder (the killed run's header).
    env = child_env(OTEL_TUNIX_JOB_ID=JOB, OTEL_TUNIX_QUIET="true")
    spawned = time.time_ns()
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(out), str(first), str(stop), str(kill_at)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, Child(spawned)


def _sum(children: list[tuple[Child, range]], key: str, i: int) -> float:
    return sum(c.steps[n][key][i] for c, steps in children for n in steps if key in c.steps[n])


def _header(folder: Path) -> dict[str, Any]:
    return next(r for r in iter_records(folder / "spans.jsonl") if r["type"] == "run")


@pytest.fixture(scope="module")
def killed_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Child, Child]:
    """Attempt 1 runs steps 0.. and is SIGKILLed in step 60 (a checkpoint after step 49);
    attempt 2, same job id, same folder, resumes at step 50 and runs to step 99."""
    out = tmp_path_factory.mktemp("job") / "job"
    proc, first = _spawn(out, 0, LAST, KILL_AT)
    assert proc.stdout is not None
    first.read(iter(proc.stdout), until="killable")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    first.killed_ns = time.time_ns()
    time.sleep(GAP_SEC)
    proc, second = _spawn(out, CHECKPOINT_EVERY, LAST, -1)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    second.read(iter(stdout.splitlines()))
    assert sorted(first.steps) == list(range(KILL_AT))
    assert sorted(second.steps) == list(range(CHECKPOINT_EVERY, LAST))
    assert not (out / "summary.json").exists() and (out / "run-2" / "summary.json").exists()
    return out, first, second


def within(value: float, bracket: tuple[float, float], *, n: int = 1) -> bool:
    return bracket[0] - n * EPS <= value <= bracket[1] + n * EPS


def test_a_killed_and_restarted_job(killed_job: tuple[Path, Child, Child], capsys: Any) -> None:
    out, first, second = killed_job
    assert main(["goodput", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == [
        "runs", "restarts", "redone_steps", "compilations", "wall_time_sec",
        "productive_time_sec", "goodput", "badput_sec",
    ]  # fmt: skip
    assert list(data["badput_sec"]) == list(cat.BADPUT)
    assert (data["runs"], data["restarts"], data["redone_steps"]) == (2, 1, 10)
    h1, h2 = _header(out), _header(out / "run-2")
    assert (h1["job_id"], h1["attempt"], h2["job_id"], h2["attempt"]) == (JOB, 1, JOB, 2)
    assert data["compilations"] == 0
    bad = data["badput_sec"]
    ns = 1e-9

    # steps 50-59 of the killed attempt: their windows lie between the child's readings
    # around each step and contain its component
    redone = [(first, range(CHECKPOINT_EVERY, KILL_AT))]
    windows_hi = sum((first.steps[n]["t1"] - first.steps[n]["t0"]) * ns for n in redone[0][1])
    assert within(bad[cat.WASTED_PROGRESS], (_sum(redone, "train_step_compute", 1), windows_hi))

    # the restart gap: from the killed attempt's last record (the end of step 59) to the
    # second attempt's start; it holds the kill and the test's wait
    s2_lo, s2_hi = second.start(_header(out / "run-2"))
    last = first.steps[KILL_AT - 1]
    last_lo = last["train_step_compute"][2] + last["train_step_compute"][1] * 1e9
    gap = (s2_lo - last["t1"]) * ns, (s2_hi - last_lo) * ns
    assert within(bad[cat.RESTART_GAP], gap, n=2)
    assert bad[cat.RESTART_GAP] >= GAP_SEC
    assert bad[cat.RESTART_GAP] >= (second.spawned_ns - first.killed_ns) * ns - 0.02

    kept = [(first, range(CHECKPOINT_EVERY)), (second, range(CHECKPOINT_EVERY, LAST))]
    save = _sum(kept, "checkpoint_save", 0), _sum(kept, "checkpoint_save", 1)
    assert within(bad[cat.CHECKPOINT_SAVE], save, n=2) and save[0] >= 2 * SAVE_SEC
    restore = second.restore[0], second.restore[1]  # before the loop, outside any step
    assert within(bad[cat.CHECKPOINT_RESTORE], restore) and restore[0] >= RESTORE_SEC

    # initialization: each attempt's start to its first step, less the restore before it
    s1_lo, s1_hi = first.start(_header(out))
    w1, w2 = first.first_step_start(), second.first_step_start()
    init = (
        ((w1[0] - s1_hi) + (w2[0] - s2_hi)) * ns - restore[1],
        ((w1[1] - s1_lo) + (w2[1] - s2_lo)) * ns - restore[0],
    )
    assert within(bad[cat.INITIALIZATION], init, n=4) and init[0] >= 2 * INIT_SEC

    # productive: the kept steps' windows less the checkpoints in them
    windows = [(c.steps[n]["t1"] - c.steps[n]["t0"]) * ns for c, r in kept for n in r]
    productive = _sum(kept, "train_step_compute", 1), sum(windows) - save[0]
    assert within(data["productive_time_sec"], productive, n=2)

    for k in (cat.COMPILATION, cat.DATA_STALL, cat.EVALUATION, cat.ROLLOUT_WAIT):
        assert bad[k] == 0.0
    # wall: the first attempt's start to the second's last record (the end of step 99)
    end = second.steps[LAST - 1]
    end_lo = end["train_step_compute"][2] + end["train_step_compute"][1] * 1e9
    wall = (end_lo - s1_hi) * ns, (end["t1"] - s1_lo) * ns
    assert within(data["wall_time_sec"], wall, n=2)
    total = data["productive_time_sec"] + sum(bad.values())
    assert abs(total - data["wall_time_sec"]) <= 0.05 * data["wall_time_sec"]
    assert data["goodput"] == pytest.approx(data["productive_time_sec"] / data["wall_time_sec"])

    # the table names the job, its runs and the categories
    assert main(["goodput", str(out)]) == 0
    text = capsys.readouterr().out
    for word in (JOB, "2 run(s)", "1 restart(s)", "10 redone", "wasted progress", "restart gap"):
        assert word in text, word


def test_a_spans_file_cut_mid_line_is_read(
    killed_job: tuple[Path, Child, Child], tmp_path: Path
) -> None:
    """A kill in the middle of a write leaves half a line: it is skipped and counted."""
    import shutil

    out, _, _ = killed_job
    copy = tmp_path / "job"
    shutil.copytree(out, copy)
    before = job_ledger(copy).to_json()
    with open(copy / "spans.jsonl", "a") as f:
        f.write('{"type": "step", "scope": "default", "step": 60, "start_ns": 17')
    ledger = job_ledger(copy)
    assert ledger.to_json() == before
    assert ledger.bad_lines == 1 and "not JSON" in ledger.notes[0]


# --- the rules, on spans files written by hand (exact nanoseconds) ---------------------------

MS = 1_000_000


def _step(n: int, start: int, end: int, *spans: dict[str, Any], scope: str = "train") -> dict:
    return {"type": "step", "scope": scope, "step": n, "start_ns": start, "end_ns": end,
            "spans": list(spans)}  # fmt: skip


def _span(name: str, start: int, end: int, **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": kw.pop("kind", "busy"), "start_ns": start, "end_ns": end,
            "span_id": kw.pop("span_id", f"{name}-{start}"), "parent": kw.pop("parent", None),
            **kw}  # fmt: skip


def _outside(name: str, start: int, end: int, **kw: Any) -> dict[str, Any]:
    return {"type": "span", "outside": True, "scope": None, "step": None, "trace_id": "0" * 32,
            **_span(name, start, end, **kw), "thread": "MainThread", "thread_id": 1,
            "attributes": {}}  # fmt: skip


def test_outside_components_loose_spans_and_a_cut_line(tmp_path: Path) -> None:
    """Every rule at once, in milliseconds from the process start (T): outside components
    before the loop and between steps, another thread's checkpoint writer, an eval step,
    a declared category, and a last line a kill cut short."""
    t = 1_700_000_000_000 * MS
    lines: list[Any] = [
        {
            "type": "run",
            "run_id": "r",
            "start_ns": t + 5 * MS,
            "process_start_ns": t,
            "resource": {"tunix.run.id": "r"},
        },
        _outside("checkpoint_restore", t + 10 * MS, t + 30 * MS),  # before the first step
        _outside("prepare", t + 30 * MS, t + 35 * MS),  # no category: initialization stays
        _step(
            0,
            t + 40 * MS,
            t + 60 * MS,
            _span("train_data_load", t + 40 * MS, t + 45 * MS, kind="blocked"),
            _span("train_step_compute", t + 45 * MS, t + 60 * MS),
        ),
        _outside("score", t + 62 * MS, t + 70 * MS, category="evaluation"),  # declared
        _step(1, t + 70 * MS, t + 90 * MS, _span("train_step_compute", t + 70 * MS, t + 90 * MS)),
        # an async writer of step 1, on another thread, running past its step (background
        # work): inside the step the training went on beside it, after it the job waited
        {
            "type": "span",
            "scope": "train",
            "step": 1,
            **_span("ckpt_write", t + 85 * MS, t + 100 * MS),
            "attributes": {"tunix.background": True},
        },
        _step(
            0,
            t + 100 * MS,
            t + 110 * MS,
            _span("forward", t + 100 * MS, t + 110 * MS),
            scope="eval",
        ),
        '{"type": "step", "scope": "train", "step": 2, "start_ns": 17',
    ]
    path = tmp_path / "run" / "spans.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines))
    ledger = job_ledger(path.parent)
    data = ledger.to_json()
    ms = 1e-3
    expected = dict.fromkeys(cat.BADPUT, 0.0)
    expected.update({
        cat.INITIALIZATION: (10 + 5 + 5) * ms,  # T..restore, prepare (no category), ..step 0
        cat.CHECKPOINT_RESTORE: 20 * ms,
        cat.DATA_STALL: 5 * ms,
        cat.OTHER: (2 + 0) * ms,  # 60..62 between steps, in nothing
        cat.EVALUATION: (8 + 10) * ms,  # the declared outside component, the eval step
        cat.CHECKPOINT_SAVE: 10 * ms,  # 90..100: the writer after step 1, in no step
    })  # fmt: skip
    assert data["badput_sec"] == pytest.approx(expected, abs=1e-12)
    assert data["productive_time_sec"] == pytest.approx((15 + 20) * ms, abs=1e-12)
    assert data["wall_time_sec"] == pytest.approx(110 * ms, abs=1e-12)
    assert (data["runs"], data["restarts"], data["redone_steps"]) == (1, 0, 0)
    assert ledger.bad_lines == 1


def test_compilations_are_the_outermost_compile_components(tmp_path: Path) -> None:
    """JAX's phases of one compilation (jax_trace, jax_lower, jax_compile: siblings) are one
    compilation; a torch_compile with a compile inside it is one; warm-up is compile time but
    no compilation."""
    t = 1_700_000_000_000 * MS
    lines = [
        {"type": "run", "run_id": "r", "start_ns": t, "resource": {}},
        _step(
            0,
            t,
            t + 50 * MS,
            _span("train_step_compute", t, t + 50 * MS, span_id="a"),
            _span("jax_trace", t + 1 * MS, t + 5 * MS, parent="a"),
            _span("jax_lower", t + 5 * MS, t + 8 * MS, parent="a"),
            _span("jax_compile", t + 8 * MS, t + 20 * MS, parent="a", span_id="c1"),
            _span("torch_compile", t + 20 * MS, t + 30 * MS, parent="a", span_id="c2"),
            _span("inductor_compile", t + 22 * MS, t + 28 * MS, parent="c2"),
            _span("warmup", t + 30 * MS, t + 35 * MS, parent="a"),
        ),
        _step(
            1,
            t + 50 * MS,
            t + 60 * MS,
            _span("jax_compile", t + 51 * MS, t + 55 * MS, span_id="c3"),
        ),  # new shapes
    ]
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = job_ledger(path).to_json()
    assert data["compilations"] == 3
    assert data["badput_sec"][cat.COMPILATION] == pytest.approx((34 + 4) * 1e-3, abs=1e-12)


def test_jax_compilations_with_new_shapes(tmp_path: Path) -> None:
    """A real jitted step called with three shapes: three compilations, and compilation
    time as JAX's own compile events (a listener of the test) say."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    import otel_tunix
    from otel_tunix.instrumentation import jax as otj
    from otel_tunix.testing import reset

    phases = ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration")
    seen: list[tuple[str, float]] = []
    listening = [False]

    def listener(event: str, duration: float, **_: Any) -> None:
        if listening[0] and event.startswith("/jax/core/compile/"):
            seen.append((event.rsplit("/", 1)[-1], duration))

    jax.monitoring.register_event_duration_secs_listener(listener)

    def body(x: Any) -> Any:
        for _ in range(3):
            x = jnp.tanh(x @ x.T)
        return x.sum()

    inputs = [jnp.ones((k, k)) for k in (32, 32, 64, 32, 96, 96)]  # made outside the steps
    reset()
    otel_tunix.configure(
        output_dir=tmp_path / "run",
        perf=otel_tunix.PerformanceMetricsConfig(perfetto_trace_dir="none"),
    )
    step_fn = otj.instrument_jit(jax.jit(body), component="train_step_compute")
    listening[0] = True
    try:
        for n, x in enumerate(inputs):
            with otel_tunix.step(n, scope="train"):
                step_fn(x).block_until_ready()
    finally:
        listening[0] = False
        otel_tunix.shutdown()
        reset()
    data = job_ledger(tmp_path / "run").to_json()
    compiles = [d for name, d in seen if name == "backend_compile_duration"]
    assert len(compiles) == 3  # shapes 32, 64, 96
    assert data["compilations"] == len(compiles)
    compile_time = sum(d for name, d in seen if name in phases)
    assert data["badput_sec"][cat.COMPILATION] == pytest.approx(compile_time, abs=1e-4)


def test_errors_give_status_2(tmp_path: Path, capsys: Any) -> None:
    assert main(["goodput", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "metrics.jsonl").write_text('{"type": "meta", "time": 1.0}\n')
    assert main(["goodput", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("otel-tunix goodput: error: ") and "no run with a recorded" in err


def test_the_ranks_of_a_run_are_one_run_their_time_summed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from analysis_runs import make_synced_rank

    run = tmp_path / "job"
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        make_synced_rank(run, compute=0.004, wait=0.002, steps=5)
    data = job_ledger(run).to_json()
    assert (data["runs"], data["restarts"], data["redone_steps"]) == (1, 0, 0)
    walls = 0.0
    blocked = 0.0
    for rank in range(3):  # each rank's header start to its last step's end, from its file
        records = list(iter_records(run / f"spans-rank{rank}.jsonl"))
        header = next(r for r in records if r["type"] == "run")
        steps = [r for r in records if r["type"] == "step"]
        start = header.get("process_start_ns", header["start_ns"])
        walls += (max(s["end_ns"] for s in steps) - start) * 1e-9
        blocked += sum(s["blocked_time_sec"] for s in steps)
    assert data["wall_time_sec"] == pytest.approx(walls, abs=1e-6)
    assert data["badput_sec"][cat.OTHER] >= blocked - 1e-6  # the all_reduce waits
