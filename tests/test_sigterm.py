"""SIGTERM (a preempted job) finishes the run before the process ends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import otel_tunix

CHILD = textwrap.dedent(
    """
    import sys, time
    import otel_tunix
    otel_tunix.configure(output_dir=sys.argv[1], perf=otel_tunix.PerformanceMetricsConfig(
        process_interval_ms=60_000))  # nothing processed before shutdown, but for the kill
    n = 0
    while True:
        with otel_tunix.step(n):
            with otel_tunix.component("train_step_compute"):
                time.sleep(0.005)
        n += 1
        if n == 20:
            print("ready", flush=True)
    """
)


def test_sigterm_writes_the_queued_steps_and_the_summary_then_ends_the_process(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(out)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # ended by the signal, as before
    lines = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step"]
    assert len(steps) >= 20  # queued for a minute, written by the handler
    assert [x["type"] for x in lines][-1] == "session"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scopes"][0]["steps"] >= 20


def test_an_application_handler_is_left_alone_and_the_default_comes_back_after_shutdown():
    def mine(signum, frame):  # pragma: no cover - never called
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        otel_tunix.configure(output_dir="none")
        assert signal.getsignal(signal.SIGTERM) is mine
        otel_tunix.shutdown()
        assert signal.getsignal(signal.SIGTERM) is mine
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        otel_tunix.configure(output_dir="none")
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # ours
        otel_tunix.shutdown()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, old)


def test_configure_from_a_thread_sets_no_handler():
    import threading

    seen = []

    def configure_here() -> None:
        otel_tunix.configure(output_dir="none")
        seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=configure_here)
    t.start()
    t.join()
    otel_tunix.shutdown()
    assert seen == [signal.SIG_DFL]


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX, if imported earlier
def test_a_forked_child_terminated_by_sigterm_does_not_finish_the_parents_run(tmp_path):
    import os

    otel_tunix.configure(output_dir=tmp_path)
    with otel_tunix.step(0):
        pass
    pid = os.fork()
    if pid == 0:  # a DataLoader-like worker, terminated by its parent
        time.sleep(30)
        os._exit(0)
    time.sleep(0.2)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGTERM
    assert not (tmp_path / "summary.json").exists()  # the child wrote nothing
    otel_tunix.shutdown()
    lines = (tmp_path / "spans.jsonl").read_text().splitlines()
    assert sum(json.loads(x)["type"] == "session" for x in lines) == 1
