"""SIGKILL at moments a test picks at random: every local file reads to its last whole
record, and the loss (steps finished by the program but missing from a file) is measured
and printed for docs/guarantees.md."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from processes import child_env
from run_files import read_jsonl

import otel_tunix

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

STEP_SEC = 0.02

PROGRAM = textwrap.dedent(
    f"""
    import sys, time
    import otel_tunix
    out = sys.argv[1]
    perf = otel_tunix.PerformanceMetricsConfig(perfetto_trace_dir=out + "/trace")
    otel_tunix.configure(output_dir=out, system_metrics=False, alerts=False, perf=perf)
    logger = otel_tunix.get_metrics_logger()
    n = 0
    while True:
        with otel_tunix.step(n):
            with otel_tunix.component("work"):
                time.sleep({STEP_SEC})
        logger.log("loss", 1.0, step=n)
        print(n, flush=True)  # the program has finished step n
        n += 1
    """
)


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    value = shift = 0
    while pos < len(data):
        b = data[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return value, pos
        shift += 7
    return None


def _trace_steps(directory: Path) -> list[int]:
    """Steps whose ``train_step`` slice begins in the streamed trace, read packet by packet
    up to the last whole one (a reader of a killed run's file does the same)."""
    (path,) = directory.glob("*.pftrace")  # made at configure(): there from the start
    data = path.read_bytes()
    pos, names, steps = 0, {}, []
    while pos < len(data):
        assert data[pos] == 0x0A  # field 1 (packet), length-delimited
        head = _varint(data, pos + 1)
        if head is None or head[1] + head[0] > len(data):
            break  # the torn tail of a killed write
        size, start = head
        packet = pb.TracePacket.FromString(data[start : start + size])
        pos = start + size
        for n in packet.interned_data.event_names:
            names[n.iid] = n.name
        ev = packet.track_event
        if packet.HasField("track_event") and ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            if (names.get(ev.name_iid) if ev.name_iid else ev.name) == "train_step":
                args = {a.name: a.int_value for a in ev.debug_annotations}
                steps.append(int(args.get("tunix.step", len(steps))))
    return steps


def _kill_after(out: Path, delay: float) -> tuple[int, dict[str, int | None]]:
    env = child_env()
    env["OTEL_TUNIX_QUIET"] = "true"
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    done: list[int] = [int(proc.stdout.readline())]
    reader = threading.Thread(
        target=lambda: done.extend(int(x) for x in proc.stdout or ()), daemon=True
    )
    reader.start()
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    reader.join(timeout=60)
    spans = [
        x["step"]
        for x in read_jsonl(out / "spans.jsonl", missing_ok=True, whole=True)
        if x["type"] == "step"
    ]
    losses = [
        x["step"]
        for x in read_jsonl(out / "metrics.jsonl", missing_ok=True, whole=True)
        if "loss" in x.get("metrics", {})
    ]
    traced = _trace_steps(out / "trace")
    last = {"spans.jsonl": spans, "metrics.jsonl": losses, "trace.pftrace": traced}
    for name, steps in last.items():  # what a file holds is the steps in order, no gap
        assert steps == list(range(len(steps))), name
    return done[-1], {name: (s[-1] if s else None) for name, s in last.items()}


def test_sigkill_at_random_moments_leaves_files_that_read_to_their_last_whole_record(
    tmp_path,
):
    rng = random.Random(21)
    delays = [0.05, *sorted(rng.uniform(0.2, 3.0) for _ in range(4)), 4.0]
    for i, delay in enumerate(delays):
        finished, last = _kill_after(tmp_path / f"run{i}", delay)
        lost = {
            name: f"{(finished - (step if step is not None else -1)) * STEP_SEC:.2f} s"
            for name, step in last.items()
        }
        print(f"killed {delay:.2f} s after the first step, at step {finished}: lost {lost}")
    # Four seconds in (16 times OTEL_TUNIX_PROCESS_INTERVAL_MS), every file has steps.
    assert all(step is not None for step in last.values()), last


def test_the_streamed_trace_exists_from_configure(tmp_path):
    perf = otel_tunix.PerformanceMetricsConfig(perfetto_trace_dir=tmp_path / "trace")
    info = otel_tunix.configure(output_dir="none", system_metrics=False, perf=perf)
    (path,) = (tmp_path / "trace").glob("*.pftrace")  # before any step
    header = pb.Trace.FromString(path.read_bytes())
    assert header.packet and header.packet[0].HasField("clock_snapshot")
    for n in range(3):
        with otel_tunix.step(n):
            pass
    otel_tunix.shutdown()
    assert info.files["perfetto"] == path
    assert _trace_steps(tmp_path / "trace") == [0, 1, 2]  # the same file, header once
