"""The live line: what it says, that a thread of its own prints it, and a real run's figures."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

import otel_tunix
from otel_tunix.logger.live_line import LiveLine
from otel_tunix.logger.perf_rows import PerfRows
from otel_tunix.model.steps import StepSummary


def _summary(scope: str, step: int, total: float, busy: float, blocked: float) -> StepSummary:
    return StepSummary(
        scope, step, 0, int(total * 1e9), total, busy, blocked, total - busy - blocked, {}
    )


def test_the_line_shows_the_latest_values_and_the_means_since_the_previous_line() -> None:
    lines: list[str] = []
    live = LiveLine(3600, write=lines.append)  # its thread never wakes in this test
    try:
        assert live.line() is None  # nothing logged yet
        live.log_scalars({"loss": 3.0, "tokens_per_sec": 900.0}, step=9)
        live.log_scalars({"loss": 2.5, "tokens_per_sec": 1234.5, "mfu": 0.25}, step=10)
        live.log_rows(
            PerfRows(
                [
                    _summary("train", 9, 0.010, 0.008, 0.001),
                    _summary("train", 10, 0.030, 0.024, 0.003),
                    _summary("eval", 0, 1.0, 1.0, 0.0),
                ]
            )
        )
        assert live.line() == (
            "otel-tunix step 10 | loss 2.5000 | tokens/s 1,234 | mfu 25.0% | step 20.0 ms | "
            "busy 80% blocked 10% idle 10%"
        )
        assert live.line() is None  # nothing new
        live.log_scalars({"rewards/mean": 0.5}, step=11)  # an RL loop shows its reward
        live.log_rows(  # an RL run: the learner's figures, whichever scope came first
            PerfRows(
                [
                    _summary("rl/actor", 11, 0.030, 0.030, 0.0),
                    _summary("rl/learner", 11, 0.002, 0.001, 0.001),
                ]
            )
        )
        assert live.line() == (
            "otel-tunix step 11 | loss 2.5000 | reward 0.500 | tokens/s 1,234 | mfu 25.0% | "
            "rl/learner step 2.0 ms | busy 50% blocked 50% idle 0%"
        )
        live.log_scalars({"loss": 1.0}, step=12)
    finally:
        live.close()
    assert lines == ["otel-tunix step 12 | loss 1.0000 | reward 0.500 | tokens/s 1,234 | mfu 25.0%"]
    with pytest.raises(ValueError, match="interval_sec"):
        LiveLine(0)


def test_lines_are_printed_by_a_thread_of_their_own() -> None:
    printed: list[tuple[str, str]] = []
    live = LiveLine(0.01, write=lambda s: printed.append((threading.current_thread().name, s)))
    try:
        live.log_scalars({"loss": 1.5}, step=3)
        deadline = time.monotonic() + 30
        while not printed and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        live.close()
    assert printed[0] == ("otel-tunix-live-line", "otel-tunix step 3 | loss 1.5000")


def test_a_configured_run_prints_its_steps_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out, console_interval=3600)  # one line, at shutdown
    for n in range(5):
        with otel_tunix.step(n):
            with otel_tunix.component("train_data_load", blocked=True):
                time.sleep(0.002)
            with otel_tunix.component("train_step_compute"):
                sum(range(30_000))
        otel_tunix.get_metrics_logger().log("loss", 5.0 - n, step=n)
    otel_tunix.shutdown()
    err = capsys.readouterr().err.strip().splitlines()
    live = [x for x in err if x.startswith("otel-tunix step")]
    assert len(live) == 1
    steps = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    steps = [x for x in steps if x["type"] == "step"]
    total = sum(x["step_time_sec"] for x in steps)
    share = {k: sum(x[f"{k}_time_sec"] for x in steps) / total for k in ("busy", "blocked", "idle")}
    assert live[0] == (
        f"otel-tunix step 4 | loss 1.0000 | step {total / 5 * 1e3:.1f} ms | "
        f"busy {share['busy']:.0%} blocked {share['blocked']:.0%} idle {share['idle']:.0%}"
    )
    with pytest.raises(otel_tunix.ConfigurationError, match="console_interval"):
        otel_tunix.configure(output_dir="none", console_interval=-1)
