"""The job at run time: a run SIGKILLed and started again with the same job id is attempt 2
of the job, with a run id of its own, and its first step span links the killed attempt's last
recorded step (at a real collector and in the spans JSONL); launcher restart counts and the
resource attributes name the attempt; ranks starting at once agree; bad values are reported
and the run goes on."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from processes import child_env
from run_files import read_jsonl

import otel_tunix
from otel_tunix.model import job as _job
from otel_tunix.run.job import last_step
from otel_tunix.support.ids import JobStepIds

PROGRAM = textwrap.dedent(
    """
    import sys, time
    import otel_tunix
    first, last, hold = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "hold"
    otel_tunix.configure(system_metrics=False, alerts=False)
    for n in range(first, last):
        with otel_tunix.step(n):
            with otel_tunix.component("work"):
                time.sleep(0.01)
        otel_tunix.log({"loss": 1.0 / (n + 1)}, step=n)
    print("done", flush=True)
    if hold:  # steps recorded and exported: wait for the SIGKILL
        time.sleep(600)
    otel_tunix.shutdown()
    """
)


def _steps(path: Path) -> list[dict[str, Any]]:
    return [x for x in read_jsonl(path, whole=True) if x["type"] == "step"]


def _start(tmp_path: Path, first: int, last: int, hold: bool, **env: str) -> subprocess.Popen[str]:
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    return subprocess.Popen(
        [sys.executable, str(script), str(first), str(last), "hold" if hold else "end"],
        env=child_env(OTEL_TUNIX_QUIET="true", **env),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_a_killed_run_started_again_is_attempt_2_linking_its_last_step(
    rotel_collector: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "job"
    env = {
        "OTEL_TUNIX_JOB_ID": "pretrain-7",
        "OTEL_TUNIX_OUTPUT_DIR": str(folder),
        "OTEL_EXPORTER_OTLP_ENDPOINT": rotel_collector.grpc_endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    t0 = time.time_ns()
    first = _start(tmp_path, 0, 8, hold=True, **env)
    assert first.stdout is not None and first.stdout.readline() == "done\n"
    rotel_collector.wait_for_span_counts({"train_step": 8}, timeout=20)
    first.send_signal(signal.SIGKILL)  # no shutdown: no summary.json, no session lines
    assert first.wait(timeout=10) == -signal.SIGKILL
    assert not (folder / "summary.json").exists()
    killed = _steps(folder / "spans.jsonl")
    assert [s["step"] for s in killed] == list(range(8))
    t1 = time.time_ns()
    second = _start(tmp_path, 6, 9, hold=False, **env)  # resumed from a checkpoint at 6
    assert second.wait(timeout=60) == 0

    head1 = read_jsonl(folder / "spans.jsonl", whole=True)[0]
    head2 = read_jsonl(folder / "run-2" / "spans.jsonl", whole=True)[0]
    assert (head1["job_id"], head1["attempt"]) == ("pretrain-7", 1)
    assert (head2["job_id"], head2["attempt"]) == ("pretrain-7", 2)
    assert head1["run_id"] == "pretrain-7" and head2["run_id"] == "pretrain-7-attempt2"
    tick = 10_000_000  # /proc's start time is in clock ticks (10 ms)
    assert t0 - tick <= head1["process_start_ns"] <= head1["start_ns"] < t1
    assert t1 - tick <= head2["process_start_ns"] <= head2["start_ns"]
    assert "link" not in head1
    last = killed[-1]  # the truth: the killed attempt's last whole step line
    assert head2["link"] == {
        "trace_id": last["trace_id"],
        "span_id": last["span_id"],
        "attributes": {
            "tunix.link.type": "previous_attempt",
            "tunix.link.source": "run_folder",
            "tunix.job.id": "pretrain-7",
            "tunix.job.attempt": 1,
            "tunix.run.id": "pretrain-7",
            "tunix.scope": "train",
            "tunix.step": 7,
        },
    }
    meta = read_jsonl(folder / "run-2" / "metrics.jsonl", whole=True)[0]
    assert meta["type"] == "meta" and meta["run_id"] == "pretrain-7-attempt2"
    assert {k: meta[k] for k in ("job_id", "attempt", "process_start_ns", "link")} == {
        k: head2[k] for k in ("job_id", "attempt", "process_start_ns", "link")
    }
    summary = json.loads((folder / "run-2" / "summary.json").read_text())
    assert (summary["job_id"], summary["attempt"]) == ("pretrain-7", 2)
    assert summary["resource"]["tunix.job.attempt"] == 2
    redone = _steps(folder / "run-2" / "spans.jsonl")
    assert [s["step"] for s in redone] == [6, 7, 8]
    assert not {s["trace_id"] for s in redone} & {s["trace_id"] for s in killed}

    out = rotel_collector.wait_for_span_counts({"train_step": 11}, timeout=20)
    steps = out.spans_named("train_step")
    by_attempt: dict[Any, list[Any]] = {}
    for s in steps:
        assert s.resource["tunix.job.id"] == "pretrain-7"
        by_attempt.setdefault(s.resource["tunix.job.attempt"], []).append(s)
    assert sorted(by_attempt) == [1, 2] and len(by_attempt[2]) == 3
    assert {s.resource["tunix.run.id"] for s in by_attempt[2]} == {"pretrain-7-attempt2"}
    linked = [s for s in by_attempt[2] if s.links]
    assert [int(s.attributes["tunix.step"]) for s in linked] == [6]  # the first step only
    (link,) = linked[0].links
    target = next(s for s in by_attempt[1] if int(s.attributes["tunix.step"]) == 7)
    assert (link.trace_id, link.span_id) == (target.trace_id, target.span_id)
    assert (link.trace_id, link.span_id) == (last["trace_id"], last["span_id"])
    assert link.attributes["tunix.link.type"] == "previous_attempt"
    assert link.attributes["tunix.link.source"] == "run_folder"
    assert int(link.attributes["tunix.job.attempt"]) == 1
    assert int(link.attributes["tunix.step"]) == 7


RANK_PROGRAM = textwrap.dedent(
    """
    import otel_tunix
    otel_tunix.configure(system_metrics=False, alerts=False)
    for n in range(3):
        with otel_tunix.step(n):
            with otel_tunix.component("work"):
                pass
    otel_tunix.shutdown()
    """
)


def _ranks_at_once(tmp_path: Path, folder: Path, **more: str) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_PROGRAM)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env=child_env(
                RANK=str(rank),
                WORLD_SIZE="2",
                OTEL_TUNIX_JOB_ID="sft-3",
                OTEL_TUNIX_OUTPUT_DIR=str(folder),
                OTEL_TRACES_EXPORTER="none",
                OTEL_METRICS_EXPORTER="none",
                OTEL_LOGS_EXPORTER="none",
                OTEL_TUNIX_STRAGGLER_WINDOW="0",
                OTEL_TUNIX_QUIET="true",
                **more,
            ),
            cwd=tmp_path,
        )
        for rank in range(2)
    ]
    for p in procs:
        assert p.wait(timeout=60) == 0


@pytest.mark.slow
def test_ranks_starting_at_once_agree_on_the_attempt_and_never_share_a_trace(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "job"
    for _ in range(3):  # three attempts, the ranks of each started together
        _ranks_at_once(tmp_path, folder)
    runs = [folder, folder / "run-2", folder / "run-3"]
    traces: list[set[str]] = []
    for attempt, run in enumerate(runs, start=1):
        heads = [read_jsonl(run / f"spans-rank{r}.jsonl", whole=True)[0] for r in range(2)]
        assert {(h["job_id"], h["attempt"], h["run_id"]) for h in heads} == {
            ("sft-3", attempt, "sft-3" if attempt == 1 else f"sft-3-attempt{attempt}")
        }
        per_rank = [_steps(run / f"spans-rank{r}.jsonl") for r in range(2)]
        # one trace per step across the ranks (job traces), derived from run id and attempt
        assert [s["trace_id"] for s in per_rank[0]] == [s["trace_id"] for s in per_rank[1]]
        expected = JobStepIds(heads[0]["run_id"], attempt)
        assert [int(s["trace_id"], 16) for s in per_rank[0]] == [
            expected.ids("train", n)[0] for n in range(3)
        ]
        traces.append({s["trace_id"] for s in per_rank[0]})
        if attempt > 1:  # each rank links its own last step of the previous attempt
            before = runs[attempt - 2]
            for r, head in enumerate(heads):
                prev = _steps(before / f"spans-rank{r}.jsonl")[-1]
                assert (head["link"]["trace_id"], head["link"]["span_id"]) == (
                    prev["trace_id"],
                    prev["span_id"],
                )
    assert not traces[0] & traces[1] and not traces[1] & traces[2] and not traces[0] & traces[2]


def _run(tmp_path: Path, **kwargs: Any) -> otel_tunix.RunInfo:
    info = otel_tunix.configure(output_dir=tmp_path / "out", system_metrics=False, **kwargs)
    with otel_tunix.step(0), otel_tunix.component("work"):
        pass
    otel_tunix.shutdown()
    return info


@pytest.mark.parametrize(
    ("launcher", "job_id"),
    [
        ({"TORCHELASTIC_RUN_ID": "f00d", "TORCHELASTIC_RESTART_COUNT": "2"}, "torchelastic-f00d"),
        ({"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2"}, "slurm-4242"),
    ],
)
def test_a_launcher_restart_count_names_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: dict[str, str], job_id: str
) -> None:
    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    info = _run(tmp_path)
    job = info.job
    assert job is not None and (job.job_id, job.attempt) == (job_id, 3)
    assert job.attempt_from.endswith("_RESTART_COUNT")
    assert info.run_id == f"{job_id}-attempt3"
    assert info.resource.attributes["tunix.job.id"] == job_id
    assert info.resource.attributes["tunix.job.attempt"] == 3
    # no record of attempt 2 here (another host's disk): the link's ids stand for it
    head = read_jsonl(tmp_path / "out" / "spans.jsonl", whole=True)[0]
    trace_id, span_id = _job.derived_ids(job_id, 2)
    assert head["link"]["trace_id"] == f"{trace_id:032x}"
    assert head["link"]["span_id"] == f"{span_id:016x}"
    assert head["link"]["attributes"]["tunix.link.source"] == "derived"
    assert head["link"]["attributes"]["tunix.job.attempt"] == 2


def test_a_launcher_count_restarted_by_hand_still_counts_the_runs_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun started again by hand with the same rendezvous id: its count is 0 again, the
    job's earlier run in the folder makes this attempt 2."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "beef")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert _run(tmp_path).run_id == "torchelastic-beef"
    again = _run(tmp_path)
    assert again.job is not None and (again.job.attempt, again.job.attempt_from) == (
        2,
        "run folders",
    )
    assert again.run_id == "torchelastic-beef-attempt2"


def test_the_attempt_from_the_resource_attributes_and_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "tunix.job.id=eval-1,tunix.job.attempt=4")
    info = _run(tmp_path)
    assert info.job is not None and (info.job.job_id, info.job.attempt) == ("eval-1", 4)
    assert info.run_id == "eval-1-attempt4"
    monkeypatch.setenv("OTEL_TUNIX_JOB_ATTEMPT", "6")  # ours wins
    monkeypatch.setenv("OTEL_TUNIX_JOB_ID", "eval-2")
    info = _run(tmp_path)
    assert info.job is not None and (info.job.job_id, info.job.attempt) == ("eval-2", 6)
    assert info.resource.attributes["tunix.job.id"] == "eval-2"


def test_a_run_without_a_job_id_is_a_job_of_its_own(tmp_path: Path) -> None:
    first, second = _run(tmp_path), _run(tmp_path)
    assert first.job is not None and second.job is not None
    assert (first.job.job_id, first.job.attempt) == (first.run_id, 1)
    assert (second.job.job_id, second.job.attempt) == (second.run_id, 1)
    assert first.run_id != second.run_id
    assert "link" not in read_jsonl(tmp_path / "out" / "run-2" / "spans.jsonl", whole=True)[0]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_TUNIX_JOB_ATTEMPT", "zero"),
        ("OTEL_TUNIX_JOB_ATTEMPT", "0"),
        ("OTEL_TUNIX_JOB_ATTEMPT", "1.5"),
        # issue #36: these were taken through float() / int() (1e30 then could not be encoded)
        ("OTEL_TUNIX_JOB_ATTEMPT", "1e30"),
        ("OTEL_TUNIX_JOB_ATTEMPT", "2.0"),
        ("OTEL_TUNIX_JOB_ATTEMPT", "1_000"),
        ("OTEL_TUNIX_JOB_ATTEMPT", "\u0663"),  # ARABIC-INDIC DIGIT THREE
        ("OTEL_TUNIX_JOB_ATTEMPT", "+3"),
        ("OTEL_TUNIX_JOB_ATTEMPT", str(2**63)),
        ("TORCHELASTIC_RESTART_COUNT", "-1"),
        ("SLURM_RESTART_COUNT", "two"),
    ],
)
def test_a_bad_attempt_is_reported_by_name_and_the_run_goes_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    name: str,
    value: str,
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_JOB_ID", "j")
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="otel_tunix"):
        info = _run(tmp_path)
    assert any(
        name in r.getMessage() and repr(value) in r.getMessage() and "ignored" in r.getMessage()
        for r in caplog.records
    ), caplog.text
    assert info.job is not None and info.job.attempt == 1  # found without it
    assert [s["step"] for s in _steps(tmp_path / "out" / "spans.jsonl")] == [0]


def test_the_largest_attempt_that_otlp_carries_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_JOB_ID", "j")
    monkeypatch.setenv("OTEL_TUNIX_JOB_ATTEMPT", str(2**63 - 1))
    info = _run(tmp_path)
    assert info.job is not None and info.job.attempt == 2**63 - 1
    header = read_jsonl(tmp_path / "out" / "spans.jsonl", whole=True)[0]
    assert header["attempt"] == 2**63 - 1


def test_a_job_id_longer_than_a_file_name_gets_a_folder_cut_by_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """86 CJK characters are 258 bytes: the folder's name was cut at 200 characters (600
    bytes, more than a file name holds) and configure() raised an OSError, or a
    ConfigurationError naming OTEL_TUNIX_OUTPUT_DIR, which was not set."""
    monkeypatch.chdir(tmp_path)
    job_id = "作业" * 43
    monkeypatch.setenv("OTEL_TUNIX_JOB_ID", job_id)
    infos = []
    for _ in range(2):  # the second run of the job: the next folder, attempt 2
        info = otel_tunix.configure(system_metrics=False)
        with otel_tunix.step(0), otel_tunix.component("work"):
            pass
        otel_tunix.shutdown()
        infos.append(info)
    folders = [i.output_dir for i in infos]
    assert all(f is not None and (f / "summary.json").is_file() for f in folders)
    names = [f.name for f in folders if f is not None]
    assert all(len(n.encode()) <= 255 for n in names), names
    assert names[0].startswith("作业" * 30) and names[1] == names[0] + "-2"
    assert [i.job.attempt for i in infos if i.job is not None] == [1, 2]
    assert [i.job.job_id for i in infos if i.job is not None] == [job_id, job_id]


def test_the_last_step_of_a_killed_file_is_its_last_whole_step_line(tmp_path: Path) -> None:
    """A step line longer than one read from the end, then a line torn by the kill."""
    otel_tunix.configure(output_dir=tmp_path / "out", system_metrics=False)
    for n in range(3):
        with otel_tunix.step(n):
            for _ in range(600 * n):  # step 2's line is over 64 KiB
                with otel_tunix.component("work"):
                    pass
    otel_tunix.shutdown()
    path = tmp_path / "out" / "spans.jsonl"
    steps = _steps(path)
    assert len(json.dumps(steps[-1])) > 1 << 16
    text = path.read_text()
    cut = text[: text.rindex('{"type":"step"') + 1000]  # the session lines and half a step
    path.write_text(text[: text.index('{"type":"session"')] + cut[text.rindex('{"type":"step"') :])
    found = last_step(path)
    assert found is not None and (found["step"], found["span_id"]) == (2, steps[-1]["span_id"])
    path.write_text(text[: text.index('{"type":"step"') + 10])  # no whole step line at all
    assert last_step(path) is None


def test_the_start_notice_names_the_job_and_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_JOB_ID", "rl-9")
    _run(tmp_path)
    monkeypatch.setenv("OTEL_TUNIX_QUIET", "false")
    capsys.readouterr()
    _run(tmp_path)
    err = capsys.readouterr().err
    assert "otel-tunix: run rl-9-attempt2 " in err
    assert "  job rl-9, attempt 2 (from run folders), after attempt 1; linking its step 0" in err


def test_a_forked_child_run_keeps_its_parents_job_and_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child forked from attempt 2 that configures a run of its own is no new attempt:
    its folder (``forked-<pid>``) is in its parent's, which it must not count."""
    monkeypatch.setenv("OTEL_TUNIX_JOB_ID", "dpo-1")
    monkeypatch.setenv("OTEL_TUNIX_JOB_ATTEMPT", "2")
    out = tmp_path / "out"
    parent = otel_tunix.configure(output_dir=out, system_metrics=False)
    pid = os.fork()
    if pid == 0:  # the child: its run's job identity to a file, then out at once
        code = 1
        try:
            monkeypatch.delenv("OTEL_TUNIX_JOB_ATTEMPT")  # it would not count anyway
            child = otel_tunix.configure(output_dir=out, system_metrics=False)
            job = child.job
            assert job is not None
            (tmp_path / "child.json").write_text(
                json.dumps([job.job_id, job.attempt, job.previous is None])
            )
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert json.loads((tmp_path / "child.json").read_text()) == ["dpo-1", 2, True]
    assert parent.job is not None and parent.job.previous is not None
    otel_tunix.shutdown()
