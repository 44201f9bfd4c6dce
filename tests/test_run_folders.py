"""Default run folders: one per run even with a reused job id; none for an empty run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import otel_tunix


def _one_step_run() -> otel_tunix.RunInfo:
    info = otel_tunix.configure()
    with otel_tunix.step(0), otel_tunix.component("work"):
        pass
    otel_tunix.shutdown()
    return info


def _steps(folder: Path, name: str = "spans.jsonl") -> list[int]:
    lines = [json.loads(x) for x in (folder / name).read_text().splitlines()]
    return [x["step"] for x in lines if x["type"] == "step"]


def test_two_runs_of_one_job_id_get_two_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    first, second = _one_step_run(), _one_step_run()
    assert first.run_id == second.run_id == "slurm-77"  # the job's id, for every rank
    runs = Path("otel-tunix-runs")
    assert first.output_dir == runs / "slurm-77"
    assert second.output_dir == runs / "slurm-77-2"
    assert _steps(runs / "slurm-77") == [0] and _steps(runs / "slurm-77-2") == [0]
    assert _one_step_run().output_dir == runs / "slurm-77-3"


def test_the_ranks_of_one_run_share_its_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("0", "1"):  # one after the other, as two processes of one job
        monkeypatch.setenv("RANK", rank)
        assert _one_step_run().output_dir == Path("otel-tunix-runs/slurm-78")
    folder = Path("otel-tunix-runs/slurm-78")
    assert _steps(folder, "spans-rank0.jsonl") == _steps(folder, "spans-rank1.jsonl") == [0]
    monkeypatch.setenv("RANK", "1")  # the job's next run: rank 1 moves on
    assert _one_step_run().output_dir == Path("otel-tunix-runs/slurm-78-2")


def test_a_run_that_recorded_nothing_leaves_no_folder(tmp_path: Path) -> None:
    info = otel_tunix.configure(run_config={"lr": 1e-3})
    assert info.output_dir is not None and info.output_dir.is_dir()
    otel_tunix.shutdown()
    assert not info.output_dir.exists()
    assert not any(Path("otel-tunix-runs").iterdir())
    # a folder given by the user stays (its files go); so do runs that logged something
    mine = tmp_path / "mine"
    mine.mkdir()
    otel_tunix.configure(output_dir=mine)
    otel_tunix.shutdown()
    assert mine.is_dir() and not any(mine.iterdir())
    logged = otel_tunix.configure()
    otel_tunix.log({"loss": 1.0}, step=0)
    otel_tunix.shutdown()
    assert logged.output_dir is not None
    assert (logged.output_dir / "metrics.jsonl").exists()
