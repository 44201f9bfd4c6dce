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
    assert first.job is not None and second.job is not None
    assert first.job.job_id == second.job.job_id == "slurm-77"  # the job's id, for every rank
    assert (first.job.attempt, second.job.attempt) == (1, 2)  # found in the first's folder
    assert (first.run_id, second.run_id) == ("slurm-77", "slurm-77-attempt2")
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


def _run_in(folder: Path, steps: int, monkeypatch: pytest.MonkeyPatch) -> otel_tunix.RunInfo:
    monkeypatch.setenv("OTEL_TUNIX_OUTPUT_DIR", str(folder))
    info = otel_tunix.configure()
    for n in range(steps):
        with otel_tunix.step(n), otel_tunix.component("work"):
            otel_tunix.log({"loss": float(n)}, step=n)
    otel_tunix.shutdown()
    return info


def test_two_runs_given_one_folder_share_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed job given the same OTEL_TUNIX_OUTPUT_DIR: the second run writes beside the
    first (in <folder>/run-2), and summary / convert / plot say which run they read."""
    from otel_tunix import cli

    folder = tmp_path / "job"
    first = _run_in(folder, 3, monkeypatch)
    first_summary = (folder / "summary.json").read_bytes()
    second = _run_in(folder, 5, monkeypatch)
    assert first.output_dir == folder and second.output_dir == folder / "run-2"
    assert _steps(folder) == [0, 1, 2]  # nothing appended to the first run's files
    assert _steps(folder / "run-2") == [0, 1, 2, 3, 4]
    assert (folder / "summary.json").read_bytes() == first_summary  # not overwritten
    summaries = [json.loads((f / "summary.json").read_text()) for f in (folder, folder / "run-2")]
    assert [s["resource"]["tunix.run.id"] for s in summaries] == [first.run_id, second.run_id]
    metrics = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "metrics" in m and "loss" in m["metrics"]] == [0, 1, 2]

    capsys.readouterr()
    assert cli.main(["summary", str(folder), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["files"] == [str(folder / "run-2" / "spans.jsonl")]
    assert out["run_ids"] == [second.run_id]
    assert out["runs"] == [str(folder), str(folder / "run-2")]
    assert out["scopes"][0]["steps"] == 5  # the second run only, never 3 + 5
    assert any(str(folder / "run-2") in n and str(folder) in n for n in out["notes"])
    assert cli.main(["summary", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "2 runs here" in text and second.run_id in text
    # a run's own folder reads that run, with no note about the others
    assert cli.main(["summary", str(folder / "spans.jsonl"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_ids"] == [first.run_id] and out["runs"] == [] and not out["notes"]
    assert out["scopes"][0]["steps"] == 3
    cli.main(["convert", str(folder), "--to", "perfetto", str(tmp_path / "t.pftrace")])
    err = capsys.readouterr().err  # said before converting (or failing for want of an extra)
    assert "holds 2 runs" in err and f"reading the newest, {folder / 'run-2'}" in err
    # a third run moves on to run-3
    assert _run_in(folder, 1, monkeypatch).output_dir == folder / "run-3"


def test_the_ranks_of_one_run_share_a_given_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    folder = tmp_path / "job"
    for run in (folder, folder / "run-2"):  # two runs of a two-rank job, one folder given
        for rank in ("0", "1"):
            monkeypatch.setenv("RANK", rank)
            assert _run_in(folder, 2, monkeypatch).output_dir == run
        assert _steps(run, "spans-rank0.jsonl") == _steps(run, "spans-rank1.jsonl") == [0, 1]


_AT_ONCE = r"""
import json, os, sys, time
import otel_tunix

start = float(sys.argv[1])
while time.time() < start:  # every process imported: all configure() within a few ms
    time.sleep(0.001)
info = otel_tunix.configure(system_metrics=False, alerts=False)
for n in range(5):
    with otel_tunix.step(n), otel_tunix.component("work"):
        pass
otel_tunix.shutdown()
print(json.dumps({"run_id": info.run_id, "attempt": info.job.attempt,
                  "folder": str(info.output_dir.resolve())}))
"""


@pytest.mark.parametrize("given", [True, False], ids=["output_dir given", "default folder"])
def test_eight_processes_configuring_at_once_never_share_a_folder(
    tmp_path: Path, given: bool
) -> None:
    """Issue #36 case 7: two or three of eight such processes wrote one folder in 11 of 20
    rounds (5 of 20 in the default folder): interleaved run headers, summary.json
    overwritten, duplicate run ids and attempts."""
    import subprocess
    import sys
    import time

    from processes import child_env

    procs_per_round, rounds = 8, 1
    env = child_env(OTEL_TUNIX_JOB_ID="race", OTEL_TUNIX_QUIET="true")
    if given:
        env["OTEL_TUNIX_OUTPUT_DIR"] = str(tmp_path / "out")
    seen: list[dict[str, object]] = []
    for _ in range(rounds):
        start = time.time() + 3.0  # after the imports (2 cores: about 1 s each)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _AT_ONCE, str(start)],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(procs_per_round)
        ]
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
            seen.append(json.loads(out.strip().splitlines()[-1]))
    total = procs_per_round * rounds
    folders = [Path(str(s["folder"])) for s in seen]
    assert len(set(folders)) == total  # one folder each
    assert sorted(int(str(s["attempt"])) for s in seen) == list(range(1, total + 1))
    assert len({s["run_id"] for s in seen}) == total
    for s, folder in zip(seen, folders, strict=True):
        lines = [json.loads(x) for x in (folder / "spans.jsonl").read_text().splitlines()]
        headers = [x for x in lines if x["type"] == "run"]
        assert len(headers) == 1 and headers[0]["run_id"] == s["run_id"]  # its own file
        assert [x["step"] for x in lines if x["type"] == "step"] == [0, 1, 2, 3, 4]
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["resource"]["tunix.run.id"] == s["run_id"]


def test_links_planted_in_a_run_folder_are_never_followed(tmp_path: Path) -> None:
    """Issue #36 case 8: a run appended its metrics to a file outside the folder through a
    metrics.jsonl link, and made the dangling target of a spans.jsonl link outside it."""
    from otel_tunix.settings.parsing import ConfigurationError

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "metrics.jsonl").write_text("theirs\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(outside / "metrics.jsonl")
    with pytest.raises(ConfigurationError) as err:
        otel_tunix.configure(output_dir=run, system_metrics=False)
    assert str(run) in str(err.value) and "metrics.jsonl" in str(err.value)
    assert "OTEL_TUNIX_OUTPUT_DIR" in str(err.value)
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]  # no claim left
    # a spans.jsonl link (dangling) marks the folder as a run's: the run goes to run-2
    (run / "metrics.jsonl").unlink()
    (run / "spans.jsonl").symlink_to(outside / "made-by-the-run.jsonl")
    for name in ("summary.json.tmp", "config.json.tmp", "trace.pftrace.tmp"):
        (outside / name).write_text("theirs\n")
        (run / "run-2").mkdir(exist_ok=True)
        (run / "run-2" / name).symlink_to(outside / name)  # .tmp names are not refused:
    (run / "run-2" / "metrics.jsonl").unlink(missing_ok=True)  # they are replaced unread
    (run / "run-2" / "config.yaml").symlink_to(outside / "theirs.yaml")  # not a run file
    info = otel_tunix.configure(output_dir=run, system_metrics=False, run_config={"lr": 1})
    with otel_tunix.step(0), otel_tunix.component("work"):
        pass
    otel_tunix.log({"loss": 1.0}, step=0)
    otel_tunix.shutdown()
    assert info.output_dir == run / "run-2"
    assert _steps(run / "run-2") == [0]
    assert json.loads((run / "run-2" / "summary.json").read_text())["scopes"]
    # nothing outside was written, made or followed
    assert sorted(p.name for p in outside.iterdir()) == [
        "config.json.tmp",
        "metrics.jsonl",
        "summary.json.tmp",
        "trace.pftrace.tmp",
    ]
    assert all(p.read_text() == "theirs\n" for p in outside.iterdir())
    # a symbolic link as a candidate folder (run-3) is never used
    (tmp_path / "elsewhere").mkdir()
    (run / "run-3").symlink_to(tmp_path / "elsewhere")
    info = otel_tunix.configure(output_dir=run, system_metrics=False)
    with otel_tunix.step(0):
        pass
    otel_tunix.shutdown()
    assert info.output_dir == run / "run-4"
    assert list((tmp_path / "elsewhere").iterdir()) == []
