"""What the ``otel-tunix`` command prints as a user meets it: through a pipe (the tables
whole, not cut at 80 columns), the same quantity under one JSON key, a note on what a
dominant category holds, and the demo's help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from otel_tunix.analysis.summary_tables import dominant_notes
from otel_tunix.analysis.timeline import Goodput


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``otel-tunix ARGS`` as a subprocess whose stdout is a pipe (``| less``)."""
    return subprocess.run(
        [sys.executable, "-m", "otel_tunix.cli", *map(str, args)],
        capture_output=True,  # stdout a pipe, as `| less` makes it
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},  # no COLUMNS
    )


def test_the_tables_are_whole_through_a_pipe(known_run: Path) -> None:
    for command in ("goodput", "summary"):
        done = _cli(command, known_run)
        assert done.returncode == 0, done.stderr
        assert "…" not in done.stdout, done.stdout  # no header or value cut short
    goodput = _cli("goodput", known_run).stdout
    header = next(line for line in goodput.splitlines() if "attempt" in line)
    columns = "folder attempt steps redone gap before s wall s goodput %"
    assert header.split() == columns.split()


def test_productive_time_has_one_key(known_run: Path) -> None:
    summary = json.loads(_cli("summary", known_run, "--json").stdout)["goodput"]
    ledger = json.loads(_cli("goodput", known_run, "--json").stdout)
    written = json.loads((known_run / "summary.json").read_text())["goodput"]
    for obj in (summary, ledger, written):
        assert "productive_time_sec" in obj and "productive_sec" not in obj
    assert summary["productive_time_sec"] == ledger["productive_time_sec"]


def test_a_dominant_category_is_said_what_it_holds(known_run: Path) -> None:
    g = Goodput(wall_time_sec=10.0, productive_sec=1.0)
    g.badput_sec["initialization"] = 8.5
    g.badput_sec["other"] = 0.5
    (note,) = dominant_notes(g)
    assert note.startswith("initialization is 85% of the wall time: everything before the")
    assert "imports" in note
    # a scope that waits most of its step while the run is productive: why it is no badput
    rl = Goodput(wall_time_sec=10.0, productive_sec=9.0)
    rl.badput_sec["rollout_wait"] = 1.0
    (note,) = dominant_notes(rl, {"rl/learner": 0.73, "rl/actor": 0.02})
    assert note.startswith("rl/learner is blocked 73% of its step time, yet productive")
    assert dominant_notes(rl, {"rl/learner": 0.4}) == []
    # the CLI prints the notes of the run it reads, under the goodput table
    out = _cli("summary", known_run).stdout
    said = dominant_notes(
        Goodput(**{k: v for k, v in _goodput_of(known_run).items() if k in _FIELDS})
    )
    for n in said:
        assert f"note: {n[:40]}" in out


_FIELDS = ("wall_time_sec", "productive_sec", "badput_sec")


def _goodput_of(run: Path) -> dict[str, object]:
    g = json.loads(_cli("summary", run, "--json").stdout)["goodput"]
    return {
        "wall_time_sec": g["wall_time_sec"],
        "productive_sec": g["productive_time_sec"],
        "badput_sec": g["badput_sec"],
    }


def test_demo_help_lists_the_rl_demo_and_its_fault() -> None:
    done = _cli("demo", "--help")
    assert done.returncode == 0
    assert "--rl" in done.stdout and "--fault" in done.stdout
    rl = _cli("demo", "--rl", "--help")
    assert rl.returncode == 0 and "--fault KIND@STEP" in rl.stdout
