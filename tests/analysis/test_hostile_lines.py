"""The CLIs on hostile lines (issue #36 case 13): JSON nested 100k deep, NaN in ``step`` /
``start_ns``, bytes that are not UTF-8, gzip bytes under a ``.jsonl`` name, a single line
far longer than any record, a folder of many runs. Before: a ``RecursionError`` traceback in
every command, ``ValueError`` in ``summary`` and ``goodput``, ``UnicodeDecodeError`` in
``convert``, 6.1 GB of memory for a 200 MB line, a 509 KB list of runs on stderr.

Now each bad line is skipped and counted (one note, one line), memory stays bounded (a line
past ``MAX_LINE_BYTES`` is read through, never held) and long lists are summarised."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otel_tunix import cli
from otel_tunix.support.linefile import MAX_LINE_BYTES


def _hostile_copy(known_run: Path, dest: Path, bad: list[bytes]) -> Path:
    """``known_run``'s spans and metrics files with the ``bad`` lines after their first
    step line (after the header)."""
    dest.mkdir(parents=True)
    for name in ("spans.jsonl", "metrics.jsonl"):
        lines = (known_run / name).read_bytes().splitlines(keepends=True)
        (dest / name).write_bytes(b"".join([*lines[:2], *bad, *lines[2:]]))
    return dest


def _step_line(known_run: Path, **changes: object) -> bytes:
    lines = (known_run / "spans.jsonl").read_text().splitlines()
    step = next(json.loads(x) for x in lines if json.loads(x).get("type") == "step")
    step.update(changes)
    return (json.dumps(step) + "\n").encode()


def _commands(folder: Path, out: Path) -> dict[str, list[str]]:
    return {
        "summary": ["summary", str(folder)],
        "summary --json": ["summary", str(folder), "--json"],
        "goodput": ["goodput", str(folder)],
        "convert": ["convert", str(folder / "spans.jsonl"), "--to", "perfetto", str(out)],
        "plot": ["plot", str(folder / "metrics.jsonl"), "-o", str(out.with_suffix(".png"))],
    }


def test_every_command_skips_and_counts_hostile_lines(known_run: Path, tmp_path, capsys):
    pytest.importorskip("rich")
    comps = (known_run / "spans.jsonl").read_text().splitlines()
    first_step = next(json.loads(x) for x in comps if json.loads(x).get("type") == "step")
    component = dict(first_step["spans"][0])  # a component's span
    bad = [
        b"[" * 100_000 + b"\n",  # nested too deep for the parser
        b'{"type": "step", "a": ' + b"[" * 100_000 + b"\n",
        _step_line(known_run, step=float("nan"), scope="nan-step"),
        _step_line(known_run, start_ns=float("nan"), step=10_001),
        _step_line(known_run, end_ns=float("inf"), step=10_002),
        b'{"type": "step", "scope": "\xff\xfe", "step": 3}\n',  # not UTF-8
        gzip.compress(b'{"type": "step"}\n') + b"\n",  # binary
    ]
    component["start_ns"] = float("nan")
    bad.append(_step_line(known_run, step=10_003, spans=[component]))
    folder = _hostile_copy(known_run, tmp_path / "hostile", bad)
    capsys.readouterr()
    for name, argv in _commands(folder, tmp_path / "t.pftrace").items():
        code = cli.main(argv)
        out, err = capsys.readouterr()
        text = out + err
        assert code == 0, (name, text[-2000:])
        assert "Traceback" not in text and "Error" not in text, (name, text[-2000:])
        if name in ("summary", "goodput"):
            assert f"{len(bad)} line(s) were not JSON records a reader can use" in text, name
        if name == "summary --json":
            assert json.loads(out)["bad_lines"] == len(bad)
    # the good lines were all read: the summary counts the run's own steps only
    cli.main(["summary", str(known_run), "--json"])
    clean = json.loads(capsys.readouterr().out)
    cli.main(["summary", str(folder), "--json"])
    hostile = json.loads(capsys.readouterr().out)
    assert [s["steps"] for s in hostile["scopes"]] == [s["steps"] for s in clean["scopes"]]


def test_a_gzip_file_under_a_jsonl_name_is_read_as_gzip(known_run: Path, tmp_path, capsys):
    folder = tmp_path / "gz"
    folder.mkdir()
    (folder / "spans.jsonl").write_bytes(gzip.compress((known_run / "spans.jsonl").read_bytes()))
    assert (
        cli.main(
            [
                "convert",
                str(folder / "spans.jsonl"),
                "--to",
                "perfetto",
                str(tmp_path / "t.pftrace"),
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out and (tmp_path / "t.pftrace").stat().st_size > 0


_MEASURE = r"""
import sys
from otel_tunix import cli
code = cli.main(sys.argv[1:])
# this process's own peak (ru_maxrss would carry the forking pytest process's over exec)
peak = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:")).split()[1]
print("MAXRSS", peak, "CODE", code)
"""


def _peak_kb(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, timeout=300
    )
    last = proc.stdout.strip().splitlines()[-1].split()
    assert last[0] == "MAXRSS" and last[3] == "0", proc.stdout[-2000:] + proc.stderr[-2000:]
    return int(last[1]), proc.stdout + proc.stderr


def test_a_line_of_64_mb_is_skipped_in_bounded_memory(known_run: Path, tmp_path):
    """Each command's peak memory on a file with one 64 MB line, against its own peak on
    the same file without it: the line is read through in blocks, never held whole."""
    pytest.importorskip("rich")
    size = 64 << 20
    assert size > MAX_LINE_BYTES
    long_line = b'{"type": "step", "x": "' + b"a" * size + b'"}\n'
    metrics_line = (
        b'{"step": 1, "metrics": {'
        + b",".join(b'"m%d": 1' % i for i in range(size // 12))
        + b"}}\n"
    )  # a million metric names, past the cap too
    hostile = _hostile_copy(known_run, tmp_path / "long", [long_line])
    lines = (hostile / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (hostile / "metrics.jsonl").write_bytes(b"".join([*lines[:2], metrics_line, *lines[2:]]))
    clean = tmp_path / "clean"
    clean.mkdir()
    for name in ("spans.jsonl", "metrics.jsonl"):
        shutil.copy(known_run / name, clean / name)
    for name in ("summary", "goodput", "convert", "plot"):
        if name == "plot":
            pytest.importorskip("matplotlib")
        base, _ = _peak_kb(_commands(clean, tmp_path / f"c-{name}.pftrace")[name])
        peak, text = _peak_kb(_commands(hostile, tmp_path / f"h-{name}.pftrace")[name])
        print(f"{name}: {base >> 10} MB clean, {peak >> 10} MB with a {size >> 20} MB line")
        assert peak - base < (MAX_LINE_BYTES >> 10) * 2 + (16 << 10), name  # KB
        assert len(text) < 4000, name  # one line for the skipped line; no list of names


def test_a_folder_of_many_runs_is_summarised(known_run: Path, tmp_path, capsys):
    pytest.importorskip("rich")
    folder = tmp_path / "many"
    folder.mkdir()
    spans = (known_run / "spans.jsonl").read_bytes()
    (folder / "spans.jsonl").write_bytes(spans)
    runs = 300
    for n in range(2, runs + 1):
        (folder / f"run-{n}").mkdir()
        (folder / f"run-{n}" / "spans.jsonl").write_bytes(spans)
    capsys.readouterr()
    for argv in (
        ["summary", str(folder)],
        ["goodput", str(folder)],
        ["convert", str(folder), "--to", "perfetto", str(tmp_path / "t.pftrace")],
    ):
        assert cli.main(argv) == 0
        out, err = capsys.readouterr()
        assert f"{runs - 11:,} more" in out + err or "more runs" in out + err, argv
        assert len((out + err).splitlines()) < 120 and len(out + err) < 12_000, argv
    assert cli.main(["goodput", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == runs  # all read
