"""TensorBoard and W&B backends: what they write is read back from the files."""

from __future__ import annotations

import math
import struct
import time
from pathlib import Path

import pytest

import otel_tunix
from otel_tunix import MetricsLoggerOptions
from otel_tunix.logger.backends import TensorBoardBackend, WandbBackend
from otel_tunix.testing import capture


def _tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_event_files_hold_the_scalars(tmp_path):
    pytest.importorskip("tensorboardX")
    tb = tmp_path / "tb"
    with capture(
        metrics_logger=MetricsLoggerOptions(
            default_backends=False, backend_factories=[lambda: TensorBoardBackend(tb)]
        )
    ):
        logger = otel_tunix.get_metrics_logger()
        for n in range(3):
            with otel_tunix.step(n):
                pass
            logger.log_dict({"loss": 2.0 - n, "rewards/mean": 0.1 * n}, step=n)
        logger.log("kl", math.nan, step=3)
        logger.log("note", 5.0)  # no step: the latest step
    got = _tensorboard_scalars(tb)
    assert got["loss"] == [(0, 2.0), (1, 1.0), (2, 0.0)]
    assert [s for s, _ in got["rewards/mean"]] == [0, 1, 2]
    assert got["rewards/mean"][2][1] == pytest.approx(0.2)
    assert got["kl"][0][0] == 3 and math.isnan(got["kl"][0][1])
    assert got["note"] == [(3, 5.0)]
    # otel-tunix's own perf scalars reach TensorBoard too, at their step
    assert [s for s, _ in got["perf/train/step_time_sec"]] == [0, 1, 2]


def _wandb_history(run_dir: Path) -> tuple[list[dict[str, str]], list[str]]:
    """History rows of an offline run, read from its ``run-*.wandb`` record log (LevelDB
    log format: 32 KiB blocks of checksum, length, type-framed chunks of protobuf records),
    and the kinds of all its records."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, buf, records = 32768, 7, b"", []
    while pos < len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if length == 0 and kind == 0:
            pos += left - 7
            continue
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            records.append(buf + chunk)
    rows = []
    kinds = []
    for raw in records:
        rec = pb.Record()
        try:
            rec.ParseFromString(raw)
        except Exception:  # a record still being written
            break
        kinds.append(rec.WhichOneof("record_type"))
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item})
    return rows, kinds


def test_wandb_offline_run_holds_the_scalars(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    settings = wandb.Settings(x_disable_stats=True, console="off", x_disable_meta=True)
    with capture(
        metrics_logger=MetricsLoggerOptions(
            default_backends=False,
            backend_factories=[
                lambda: WandbBackend(
                    project="p",
                    run_name="r",
                    mode="offline",
                    dir=tmp_path,
                    settings=settings,
                    config={"lr": 1e-4},
                )
            ],
        )
    ):
        logger = otel_tunix.get_metrics_logger()
        logger.log_dict({"loss": 1.5, "kl": 0.01}, step=2)
        logger.log_dict({"loss": 1.25}, step=5)
        logger.log("late", 7.0, step=3)  # out of order: kept, plotted at step 3
        logger.log("kl", math.nan, step=6)
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    deadline = time.monotonic() + 20
    while True:  # wandb-core may still be writing the file when finish() returns
        history, kinds = _wandb_history(run_dir)
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in history]
    assert rows == [
        {"step": "2", "loss": "1.5", "kl": "0.01"},
        {"step": "5", "loss": "1.25"},
        {"step": "3", "late": "7"},
        {"step": "6", "kl": "NaN"},
    ], kinds
    assert wandb.run is None  # finished at shutdown


def test_missing_packages_name_the_extra(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"otel-tunix\[tensorboard\]"):
        TensorBoardBackend(tmp_path)
    with pytest.raises(ImportError, match=r"otel-tunix\[wandb\]"):
        WandbBackend()
