"""Readers and metric selection: flattening, gzip, folders, streaming, smoothing."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

from otel_tunix.analysis import (  # noqa: E402
    AnalysisError,
    MetricsTable,
    default_metrics,
    filter_metrics,
    flatten_record,
    moving_average,
    read_jsonl,
    resolve_metrics_file,
    resolve_spans_files,
)

NaN = float("nan")
META = {"type": "meta", "time": 1.0, "run": "run-a", "run_id": "run-a", "rank": 0}


def test_flatten_record_nested_slash_prefix_and_non_numbers() -> None:
    rec = {
        "step": 3,
        "time": 12.5,
        "_type": "epoch_end",
        "host": "h1",
        "nonfinite": True,
        "metrics": {"loss": 1.5, "rewards/mean": 0.25, "train": {"acc": 0.9}, "tag": "x"},
        "val": {"loss": 2.0},
    }
    assert flatten_record(rec) == {
        "step": 3.0,
        "time": 12.5,
        "loss": 1.5,
        "rewards/mean": 0.25,
        "train.acc": 0.9,
        "val.loss": 2.0,
    }
    assert flatten_record({"prefix": "val", "step": 1, "metrics": {"loss": 4}}) == {
        "step": 1.0,
        "val.loss": 4.0,
    }


@pytest.mark.parametrize("name", ["metrics.jsonl", "metrics.jsonl.gz"])
def test_read_jsonl_plain_and_gzip_tolerates_a_cut_last_line(
    tmp_path: Path, jsonl_writer: Callable[..., Path], name: str
) -> None:
    path = jsonl_writer(
        tmp_path / "run-a" / name,
        [
            META,
            {"step": 0, "time": 1.0, "metrics": {"loss": 3.0, "learning_rate": 0.1}},
            {"step": 0, "time": 1.1, "metrics": {"perf/train/step_time_sec": 0.5}},
            {"step": 1, "time": 2.0, "metrics": {"loss": 2.0, "learning_rate": NaN}},
            "",
            '{"step": 2, "time": 3.0, "metrics": {"loss": 1.',  # cut short by a crash
        ],
    )
    df = read_jsonl(path)
    assert df.attrs["run"] == "run-a"
    assert df["step"].tolist() == [0, 0, 1]
    assert df["loss"].tolist()[0::2] == [3.0, 2.0] and math.isnan(df["loss"][1])
    assert math.isnan(df["learning_rate"][2])  # NaN logged by the MetricsLogger stays NaN
    assert df.attrs["names"] == ["loss", "learning_rate", "perf/train/step_time_sec"]
    # the run folder finds the same file
    assert read_jsonl(tmp_path / "run-a")["loss"].count() == 2


def test_read_jsonl_with_a_selection_keeps_only_those_columns(
    tmp_path: Path, jsonl_writer: Callable[..., Path]
) -> None:
    path = jsonl_writer(
        tmp_path / "m.jsonl",
        [
            {"step": n, "metrics": {"loss": n, "perf/train/a": 1, "perf/train/b": 2, "x": 0}}
            for n in range(5)
        ],
    )
    df = read_jsonl(path, metrics=["loss", "perf/train"])
    assert sorted(df.columns) == ["loss", "perf/train/a", "perf/train/b", "step"]
    assert df.attrs["names"] == ["loss", "perf/train/a", "perf/train/b", "x"]
    assert df.attrs["run"] == "m"


def test_metrics_table_reads_only_what_was_appended(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "metrics": {"loss": 1}}\n{"step": 1, "metr')
    table = MetricsTable(path)
    assert table.poll(final=False) == 1  # the half-written line waits for its newline
    with path.open("a") as f:
        f.write('ics": {"loss": 2}}\n{"step": 2, "metrics": {"loss": 3}}\n')
    assert table.poll(final=False) == 2
    assert table.poll(final=False) == 0
    assert table.frame()["loss"].tolist() == [1.0, 2.0, 3.0]
    path.write_text('{"step": 0, "metrics": {"loss": 9}}\n')  # rewritten: read again
    assert table.poll() == 1 and table.frame()["loss"].tolist() == [9.0]


def test_directory_gives_the_newest_metrics_file(
    tmp_path: Path, jsonl_writer: Callable[..., Path]
) -> None:
    old = jsonl_writer(tmp_path / "runs" / "a" / "metrics.jsonl", [{"step": 0}])
    new = jsonl_writer(tmp_path / "runs" / "b" / "metrics.jsonl.gz", [{"step": 0}])
    jsonl_writer(tmp_path / "runs" / "c" / "spans.jsonl", [{"type": "step"}])
    os.utime(old, (1_000, 1_000))
    os.utime(new, (2_000, 2_000))
    assert resolve_metrics_file(tmp_path / "runs") == new
    assert resolve_metrics_file(tmp_path / "runs" / "a") == old
    other = jsonl_writer(tmp_path / "seed" / "logs" / "train_log.jsonl", [{"step": 0}])
    assert resolve_metrics_file(tmp_path / "seed") == other
    with pytest.raises(AnalysisError, match="no metrics JSONL file"):
        resolve_metrics_file(tmp_path / "runs" / "c")
    with pytest.raises(AnalysisError, match="no such file"):
        resolve_metrics_file(tmp_path / "nope")


def test_spans_files_one_per_rank(tmp_path: Path, jsonl_writer: Callable[..., Path]) -> None:
    run = tmp_path / "run"
    for name in ("spans-rank10.jsonl", "spans-rank2.jsonl", "spans-rank0.jsonl.gz"):
        jsonl_writer(run / name, [{"type": "step"}])
    jsonl_writer(run / "metrics.jsonl", [{"step": 0}])
    assert [p.name for p in resolve_spans_files(run)] == [
        "spans-rank0.jsonl.gz",
        "spans-rank2.jsonl",
        "spans-rank10.jsonl",
    ]
    assert resolve_spans_files(tmp_path) == resolve_spans_files(run)


def test_filter_metrics_names_prefixes_and_errors(
    tmp_path: Path, jsonl_writer: Callable[..., Path]
) -> None:
    path = jsonl_writer(
        tmp_path / "m.jsonl",
        [
            {"step": 0, "metrics": {"loss": 1.0}},
            {"step": 0, "metrics": {"perf/train/step_time_sec": 0.1, "grad_norm": 3.0}},
            {"step": 1, "metrics": {"loss": 0.5}},
        ],
    )
    df = read_jsonl(path)
    out = filter_metrics(df, ["perf/train"])
    assert list(out.columns) == ["step", "perf/train/step_time_sec"]
    assert out["perf/train/step_time_sec"].tolist() == [0.1]  # rows without it are dropped
    with pytest.raises(AnalysisError) as err:
        filter_metrics(df, ["val.loss"])
    assert "unknown metric 'val.loss'" in str(err.value)
    assert "grad_norm, loss, perf/train/step_time_sec" in str(err.value)
    with pytest.raises(AnalysisError, match="no column 'epoch'"):
        filter_metrics(df, ["loss"], x_key="epoch")
    assert list(filter_metrics(df, ["val.loss", "loss"], missing="ignore").columns) == [
        "step",
        "loss",
    ]


def test_moving_average_smooths_each_column_over_its_own_values() -> None:
    df = pd.DataFrame(
        {
            "step": [0, 0, 1, 2, 3, 4],
            "loss": [1.0, NaN, 2.0, 3.0, 4.0, 5.0],
            "lr": [NaN, 10.0, NaN, NaN, NaN, 20.0],
        }
    )
    out = moving_average(df, 2)
    assert out["step"].tolist() == [0, 0, 1, 2, 3, 4]
    assert out["loss"].dropna().tolist() == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert out["lr"].dropna().tolist() == [10.0, 15.0]
    assert moving_average(df, 0).equals(df)
    with pytest.raises(AnalysisError):
        moving_average(df, -1)


def test_default_metrics_picks_the_common_ones() -> None:
    names = [
        "grad_norm",
        "eval/loss",
        "loss",
        "learning_rate",
        "perf/eval/step_time_sec",
        "perf/train/step_time_sec",
        "rewards/mean",
        "rewards/std",
        "perplexity",
    ]
    assert default_metrics(names) == [
        "loss",
        "eval/loss",
        "learning_rate",
        "perf/train/step_time_sec",
        "rewards/mean",
    ]
    assert default_metrics(["train.loss", "val.loss", "train.lr"]) == [
        "train.loss",
        "val.loss",
        "train.lr",
    ]
    assert default_metrics(["grad_norm"]) == []
