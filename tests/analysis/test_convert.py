"""``otel-tunix convert``: a finished run's spans JSONL to a Perfetto trace, read back with
the Perfetto protos."""

from __future__ import annotations

import gzip
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from analysis_runs import CHECKPOINT_STEP, EVAL_STEPS, STEPS

from otel_tunix.analysis.readers import iter_records
from otel_tunix.cli import main

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")


def slices(data: bytes) -> list[tuple[str, int]]:
    """``(name, timestamp)`` of every slice begin in a trace."""
    trace = pb.Trace()
    trace.ParseFromString(data)
    names: dict[tuple[int, int], str] = {}
    out = []
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        for n in p.interned_data.event_names:
            names[(seq, n.iid)] = n.name
        if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            ev = p.track_event
            name = ev.name if ev.HasField("name") else names[(seq, ev.name_iid)]
            out.append((name, p.timestamp))
    return out


@pytest.mark.parametrize("gz", [False, True])
def test_convert_a_real_run(known_run: Path, tmp_path: Path, capsys: Any, gz: bool) -> None:
    src = known_run / "spans.jsonl"
    if gz:
        src = tmp_path / "spans.jsonl.gz"
        src.write_bytes(gzip.compress((known_run / "spans.jsonl").read_bytes()))
    out = tmp_path / "trace" / "run.pftrace"
    assert main(["convert", str(src), "--to", "perfetto", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    got = slices(out.read_bytes())
    counts = Counter(name for name, _ in got)
    assert counts["train_step"] == STEPS and counts["eval_step"] == EVAL_STEPS
    assert counts["train_data_load"] == STEPS and counts["train_step_compute"] == STEPS
    assert counts["checkpoint_save"] == 1 and counts["eval_step_compute"] == EVAL_STEPS
    # slices start where the spans JSONL says the steps started
    starts = sorted(
        r["start_ns"]
        for r in iter_records(known_run / "spans.jsonl")
        if r.get("type") == "step" and r["scope"] == "train"
    )
    assert sorted(ts for name, ts in got if name == "train_step") == starts
    ckpt = next(
        r for r in iter_records(known_run / "spans.jsonl") if r.get("step") == CHECKPOINT_STEP
    )
    (save,) = [s for s in ckpt["spans"] if s["name"] == "checkpoint_save"]
    assert ("checkpoint_save", save["start_ns"]) in got


def test_run_folder_is_accepted(known_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.pftrace"
    assert main(["convert", str(known_run), "--to", "perfetto", str(out)]) == 0
    assert Counter(n for n, _ in slices(out.read_bytes()))["train_step"] == STEPS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{d}/none.jsonl", "--to", "perfetto", "o.pftrace"], "no such file or directory"),
        (["{d}/spans.jsonl", "--to", "chrome", "o.pftrace"], "invalid choice: 'chrome'"),
        (["{d}/spans.jsonl", "o.pftrace"], "the following arguments are required: --to"),
        (["{d}/ranks", "--to", "perfetto", "o.pftrace"], "one spans file per rank"),
        (["{d}/spans.jsonl", "--to", "perfetto", "o.pftrace"], "no step records to convert"),
    ],
)
def test_errors_give_status_2(
    tmp_path: Path, jsonl_writer: Callable[..., Path], capsys: Any, args: list[str], message: str
) -> None:
    jsonl_writer(tmp_path / "spans.jsonl", [{"type": "session", "scope": "train"}])
    for r in (0, 1):
        jsonl_writer(tmp_path / "ranks" / f"spans-rank{r}.jsonl", [{"type": "step"}])
    assert main(["convert", *[a.format(d=tmp_path) for a in args]]) == 2
    assert message in capsys.readouterr().err
    assert not Path("o.pftrace").exists()
