"""One trace per step across the ranks of a job: real processes (three ranks as a launcher
starts them) exporting over OTLP to a real collector (rotel)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from processes import child_env

from otel_tunix.support.ids import JobStepIds


def test_job_step_ids_are_shared_by_a_run_and_distinct_within_it() -> None:
    a, a_again, b = JobStepIds("slurm-42"), JobStepIds("slurm-42"), JobStepIds("slurm-43")
    assert a.ids("train", 7) == a_again.ids("train", 7)  # every rank derives the same
    assert a.ids("train", 7) != b.ids("train", 7)  # another run: unrelated ids
    ids = {a.ids(scope, n) for scope in ("train", "eval") for n in range(20_000)}
    assert len(ids) == 40_000  # no two steps of a run share a trace or a root
    assert len({t for t, _ in ids}) == 40_000
    assert all(t > 0 and 0 < r < 2**64 for t, r in ids)


RANK_SCRIPT = """
import time
import otel_tunix

otel_tunix.configure()
for n in range(3):
    with otel_tunix.step(n):
        with otel_tunix.component("forward"):
            time.sleep(0.005)
otel_tunix.shutdown()
"""


def _ranks(tmp_path: Path, endpoint: str, job: str, world: int = 3) -> None:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    procs = []
    for rank in range(world):
        env = child_env(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            TORCHELASTIC_RUN_ID=job,
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_TUNIX_OUTPUT_DIR="none",
            OTEL_TUNIX_SYSTEM_METRICS_INTERVAL="0",
            OTEL_TUNIX_QUIET="true",
        )
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path))
    for p in procs:
        assert p.wait(timeout=60) == 0


@pytest.mark.slow
def test_step_n_is_one_trace_on_every_rank_under_one_root(
    rotel_collector: Any, tmp_path: Path
) -> None:
    _ranks(tmp_path, rotel_collector.grpc_endpoint, "job-a")
    out = rotel_collector.wait_for_span_counts({"train_step": 9, "train_job_step": 3}, timeout=15)
    steps: dict[int, list[Any]] = defaultdict(list)
    for s in out.spans_named("train_step"):
        steps[int(s.attributes["tunix.step"])].append(s)
    roots = {int(s.attributes["tunix.step"]): s for s in out.spans_named("train_job_step")}
    assert sorted(steps) == sorted(roots) == [0, 1, 2]
    traces = set()
    for n, spans in steps.items():
        root = roots[n]
        assert root.parent_span_id is None and root.resource["tunix.rank"] == 0
        assert sorted(s.resource["tunix.rank"] for s in spans) == [0, 1, 2]
        assert {s.trace_id for s in spans} == {root.trace_id}  # one trace for the step
        assert {s.parent_span_id for s in spans} == {root.span_id}  # under one root
        traces.add(root.trace_id)
        forward = [c for c in out.spans_named("forward") if c.trace_id == root.trace_id]
        assert len(forward) == 3  # each rank's components in the same trace
    assert len(traces) == 3  # a trace per step


LOG_SCRIPT = """
import otel_tunix

otel_tunix.configure()
for n in range(10):
    with otel_tunix.step(n):
        pass
    otel_tunix.log({"loss": 1.0 / (n + 1)}, step=n)
otel_tunix.shutdown()
"""


@pytest.mark.slow
def test_ranks_sharing_a_run_folder_keep_their_rows_apart(tmp_path: Path) -> None:
    """Two ranks with OTEL_TUNIX_LOG_ALL_RANKS write into one run folder: a metrics file
    each (rank 0's metrics.jsonl, rank 1's metrics-rank1.jsonl), ten rows per rank."""
    script = tmp_path / "log.py"
    script.write_text(textwrap.dedent(LOG_SCRIPT))
    run_dir = tmp_path / "run"
    procs = []
    for rank in range(2):
        env = child_env(
            RANK=str(rank),
            WORLD_SIZE="2",
            TORCHELASTIC_RUN_ID="job-b",
            OTEL_TUNIX_OUTPUT_DIR=str(run_dir),
            OTEL_TUNIX_LOG_ALL_RANKS="true",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_TUNIX_SYSTEM_METRICS_INTERVAL="0",
            OTEL_TUNIX_QUIET="true",
        )
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path))
    for p in procs:
        assert p.wait(timeout=60) == 0
    for rank, name in ((0, "metrics.jsonl"), (1, "metrics-rank1.jsonl")):
        lines = [json.loads(x) for x in (run_dir / name).read_text().splitlines()]
        assert lines[0]["type"] == "meta" and lines[0]["rank"] == rank
        losses = [r["step"] for r in lines[1:] if "loss" in r["metrics"]]
        assert losses == list(range(10)), name
