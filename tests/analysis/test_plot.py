"""``otel-tunix plot``: the data drawn, the PNG written, the error messages."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

from analysis_runs import STEPS, loss_at  # noqa: E402

from otel_tunix import cli  # noqa: E402
from otel_tunix.analysis import plotting  # noqa: E402
from otel_tunix.analysis.plotting import PlotSpec, load_runs, watch  # noqa: E402
from otel_tunix.cli import main  # noqa: E402


def drawn(fig: Any) -> dict[tuple[str, str], np.ndarray]:
    """``{(panel title, legend label): xy}`` of every line in the figure."""
    out = {}
    for ax in fig.axes:
        for line in ax.lines:
            out[(ax.get_title(loc="left"), line.get_label())] = line.get_xydata()
    return out


def assert_real_png(path: Path, min_colors: int = 3) -> None:
    """The file decodes as a PNG with a sensible size and is not one flat colour."""
    with Image.open(path) as img:
        assert img.format == "PNG"
        w, h = img.size
        assert w >= 300 and h >= 200
        pixels = np.asarray(img.convert("RGB"))
    assert pixels.std() > 5
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) >= min_colors
    # something other than white and black: the coloured lines
    rgb = pixels.reshape(-1, 3).astype(int)
    assert ((rgb.max(axis=1) - rgb.min(axis=1)) > 60).sum() > 50


@pytest.fixture
def spy_figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Figures that ``save_plot`` writes, for checking what the CLI drew."""
    saved: list[Any] = []
    real = plotting.save_plot

    def spy(fig: Any, path: Any, **kwargs: Any) -> Path:
        saved.append(fig)
        return real(fig, path, **kwargs)

    monkeypatch.setattr(cli, "save_plot", spy)  # the CLI's own binding of it
    return saved


def rolling(values: list[float], window: int) -> list[float]:
    return [float(np.mean(values[max(0, i - window + 1) : i + 1])) for i in range(len(values))]


def test_two_runs_nested_gzip_smoothed(
    tmp_path: Path, jsonl_writer: Callable[..., Path], spy_figures: list[Any], capsys: Any
) -> None:
    a_loss = [5.0, 4.0, 6.0, 2.0, 1.0, 3.0]
    b_loss = [9.0, 7.0, 5.0, 3.0]
    jsonl_writer(  # the seed's layout: nested dicts, a val record now and then
        tmp_path / "expA" / "metrics.jsonl",
        [{"step": n, "metrics": {"train": {"loss": v}}} for n, v in enumerate(a_loss)]
        + [{"step": 5, "_type": "epoch_end", "metrics": {"val": {"loss": 2.5}}}],
    )
    jsonl_writer(  # otel-tunix's layout, gzip, a meta header that names the run
        tmp_path / "expB" / "metrics.jsonl.gz",
        [{"type": "meta", "time": 0.0, "run": "baseline"}]
        + [{"step": 10 * n, "metrics": {"train.loss": v}} for n, v in enumerate(b_loss)],
    )
    out = tmp_path / "plots" / "loss.png"
    rc = main(
        ["plot", "--input", str(tmp_path / "expA" / "metrics.jsonl"), str(tmp_path / "expB"),
         "--metrics", "train.loss", "val.loss", "--smooth", "3", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert "wrote" in capsys.readouterr().out
    (fig,) = spy_figures
    lines = drawn(fig)
    assert set(lines) == {("train.loss", "expA"), ("train.loss", "baseline"), ("val.loss", "expA")}
    np.testing.assert_allclose(lines[("train.loss", "expA")][:, 0], range(6))
    np.testing.assert_allclose(lines[("train.loss", "expA")][:, 1], rolling(a_loss, 3))
    np.testing.assert_allclose(lines[("train.loss", "baseline")][:, 0], [0, 10, 20, 30])
    np.testing.assert_allclose(lines[("train.loss", "baseline")][:, 1], rolling(b_loss, 3))
    np.testing.assert_allclose(lines[("val.loss", "expA")], [[5, 2.5]])
    assert fig.axes[0].get_legend() is not None
    assert_real_png(out)


def test_default_metrics_from_a_real_run(known_run: Path, spy_figures: list[Any]) -> None:
    assert main(["plot", str(known_run)]) == 0
    (fig,) = spy_figures
    lines = drawn(fig)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == ["loss", "eval/loss", "learning_rate", "perf/train/step_time_sec"]
    # the legend names the run's service (configure(service_name=...)), not its run id
    xy = lines[("loss", "analysis-test")]
    np.testing.assert_allclose(xy[:, 0], range(STEPS))
    np.testing.assert_allclose(xy[:, 1], [loss_at(n) for n in range(STEPS)])
    step_times = lines[("perf/train/step_time_sec", "analysis-test")][:, 1]
    assert len(step_times) == STEPS and (step_times >= 0.029).all()  # data + compute sleeps
    # units on the y axes; a sparse series (two evaluations) drawn with a marker per point
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "loss", "", "seconds"]
    (eval_line,) = fig.axes[1].lines
    assert eval_line.get_marker() == "o" and len(eval_line.get_xdata()) <= 2
    assert_real_png(known_run / "metrics.png")


def test_slash_names_x_key_time_and_thinning(
    tmp_path: Path, jsonl_writer: Callable[..., Path]
) -> None:
    path = jsonl_writer(
        tmp_path / "r" / "metrics.jsonl",
        [
            {"step": n, "time": 100.0 + n / 2, "metrics": {"rewards/mean": float(n)}}
            for n in range(1000)
        ],
    )
    spec = PlotSpec(metrics=["rewards/mean"], x_key="time", max_points=100)
    (table,) = load_runs([path], spec)
    table.poll()
    rendered = plotting.render([table], spec)
    xy = drawn(rendered.figure)[("rewards/mean", "r")]
    assert xy[0].tolist() == [0.0, 0.0]  # seconds since the first record
    assert xy[-1].tolist() == [499.5, 999.0]  # the last point is always kept
    assert 100 <= len(xy) <= 101
    np.testing.assert_allclose(np.diff(xy[:-1, 1]), 10.0)  # every 10th point
    assert rendered.figure.axes[-1].get_xlabel() == "seconds since the first record"


def test_live_redraws_as_the_file_grows(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text('{"type": "meta", "time": 0, "run": "live"}\n')
    out = tmp_path / "live.png"
    spec = PlotSpec(metrics=["loss"])
    tables = load_runs([path], spec)
    updates: list[int] = []

    def writer() -> None:
        for n in range(6):
            with path.open("a") as f:
                f.write(f'{{"step": {n}, "metrics": {{"loss": {n * n}}}}}\n')
            time.sleep(0.05)

    thread = threading.Thread(target=writer)
    thread.start()
    deadline = time.monotonic() + 20
    last = watch(
        tables,
        spec,
        out=out,
        interval=0.02,
        on_update=lambda r: updates.append(len(r.frames[0])),
        stop=lambda: tables[0].rows >= 6 or time.monotonic() > deadline,
    )
    thread.join()
    assert last is not None and updates and updates[-1] == 6
    assert len(updates) >= 2  # drawn more than once, as the rows came in
    np.testing.assert_allclose(drawn(last.figure)[("loss", "live")], [[n, n * n] for n in range(6)])
    assert_real_png(out)


def test_cli_live_waits_for_records_then_writes(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    spec = PlotSpec()
    tables = load_runs([path], spec)
    errors: list[str] = []
    result = watch(tables, spec, interval=0.01, stop=lambda: True, on_error=errors.append)
    assert result is None and not errors  # an empty file is waited for, not an error


def test_unknown_metric_lists_what_exists(
    tmp_path: Path, jsonl_writer: Callable[..., Path], capsys: Any
) -> None:
    path = jsonl_writer(
        tmp_path / "metrics.jsonl", [{"step": 0, "metrics": {"loss": 1, "rewards/mean": 2}}]
    )
    assert main(["plot", str(path), "--metrics", "val.loss", "--out", "x.png"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("otel-tunix plot: error: unknown metric 'val.loss'")
    assert "metrics that exist: loss, rewards/mean" in err
    assert not Path("x.png").exists()


def test_empty_file_and_no_common_metric(
    tmp_path: Path, jsonl_writer: Callable[..., Path], capsys: Any
) -> None:
    empty = jsonl_writer(tmp_path / "a" / "metrics.jsonl", [{"type": "meta", "time": 0}])
    assert main(["plot", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "no metric records (1 lines read)" in err and str(empty) in err
    other = jsonl_writer(tmp_path / "b" / "metrics.jsonl", [{"step": 0, "metrics": {"acc": 1}}])
    assert main(["plot", str(other)]) == 2
    err = capsys.readouterr().err
    assert "none of the common metrics" in err and "--metrics: acc" in err
    assert main(["plot", str(empty), str(other), "--metrics", "acc"]) == 2
    assert "the other inputs hold: acc" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give one or more metrics files"),
        (["nope/metrics.jsonl"], "nope/metrics.jsonl: no such file or directory"),
        (["{run}", "--smooth", "-2"], "--smooth must be 0 or more"),
        (["{run}", "--x-key", "epoch"], "no 'epoch' field for the x axis"),
        (["{run}", "--interval", "0"], "--interval must be positive"),
        (["{run}", "--bogus"], "unrecognized arguments: --bogus"),
        (["{run}", "--out", "x.jpgx"], "--out x.jpgx: unknown image type; use one of: "),
    ],
)
def test_errors_are_one_line_and_status_2(
    tmp_path: Path, jsonl_writer: Callable[..., Path], capsys: Any, args: list[str], message: str
) -> None:
    run = tmp_path / "run"
    jsonl_writer(run / "metrics.jsonl", [{"step": 0, "metrics": {"loss": 1.0}}])
    assert main(["plot", *[a.format(run=run) for a in args]]) == 2
    assert message in capsys.readouterr().err


def test_show_without_a_display_is_a_clear_error(
    tmp_path: Path, jsonl_writer: Callable[..., Path], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib

    monkeypatch.setattr(matplotlib, "get_backend", lambda: "agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "get_backend", lambda: "agg")
    path = jsonl_writer(tmp_path / "metrics.jsonl", [{"step": 0, "metrics": {"loss": 1.0}}])
    assert main(["plot", str(path), "--show"]) == 2
    assert "--show needs a display" in capsys.readouterr().err
    out = tmp_path / "still.png"
    assert main(["plot", str(path), "--show", "--out", str(out)]) == 0
    assert out.exists()


def test_cli_live_until_ctrl_c(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text('{"step": 0, "metrics": {"loss": 4.0}}\n')
    out = tmp_path / "live.png"
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_tunix.cli", "plot", str(path.parent), "--live",
         "--interval", "0.05", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert out.exists(), proc.stderr.read() if proc.poll() is not None else "no plot"
        first = out.stat().st_mtime_ns
        with path.open("a") as f:
            f.write('{"step": 1, "metrics": {"loss": 2.0}}\n')
        while out.stat().st_mtime_ns == first and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert stdout.count("updated") == 2 and "(2 rows)" in stdout
    assert_real_png(out)


def test_missing_extra_is_a_clear_error(
    tmp_path: Path, jsonl_writer: Callable[..., Path], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    path = jsonl_writer(tmp_path / "metrics.jsonl", [{"step": 0, "metrics": {"loss": 1.0}}])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert main(["plot", str(path)]) == 2
    err = capsys.readouterr().err
    assert "plots need pandas and matplotlib: pip install 'otel-tunix[analysis]'" in err


def test_fired_alerts_are_marked_on_their_metrics_panel(
    tmp_path: Path, spy_figures: list[Any]
) -> None:
    """A real run whose alert engine fires on ``loss`` at step 3 (and resolves at step 4):
    ``plot`` marks the firing on the loss panel only, at that step, with its message."""
    import otel_tunix
    from otel_tunix.metrics.alerts import ThresholdRule, above
    from otel_tunix.testing import reset

    reset()
    rule = ThresholdRule("loss_high", ("loss",), warning=above(5.0), description="too high")
    info = otel_tunix.configure(
        output_dir=tmp_path / "run", alerts=[rule], system_metrics=False, console_interval=0
    )
    logger = otel_tunix.get_metrics_logger()
    losses = [4.0, 3.0, 2.5, 9.0, 2.0, 1.5]
    for n, v in enumerate(losses):
        logger.log_dict({"loss": v, "learning_rate": 0.1}, step=n)
    otel_tunix.shutdown()
    run = info.output_dir
    assert run is not None
    records = [json.loads(x) for x in (run / "alerts.jsonl").read_text().splitlines()]
    assert [r["tunix.alert.severity"] for r in records] == ["warning", "ok"]  # fired, resolved
    fired = records[0]

    assert main(["plot", str(run), "--metrics", "loss", "learning_rate"]) == 0
    (fig,) = spy_figures
    panels = {ax.get_title(loc="left"): ax for ax in fig.axes}
    loss_ax, lr_ax = panels["loss"], panels["learning_rate"]
    assert [t.get_text() for t in loss_ax.texts] == [fired["message"]]
    assert loss_ax.texts[0].xy[0] == 3  # at the step it fired
    marks = [ln for ln in loss_ax.lines if ln.get_label().startswith("_")]  # unlabelled: axvline
    assert len(marks) == 1 and list(marks[0].get_xdata()) == [3, 3]
    assert not lr_ax.texts and len(lr_ax.lines) == 1  # another metric: no mark

    # on the time axis, at the time it fired: while step 3's values were logged, so after
    # that record's time stamp and before step 4's
    spec = PlotSpec(metrics=["loss"], x_key="time")
    (table,) = load_runs([run], spec)
    table.poll()
    rendered = plotting.render([table], spec)
    times = rendered.frames[0]["time"].to_numpy()
    (text,) = rendered.figure.axes[0].texts
    assert times[3] - times[0] - 1e-6 <= text.xy[0] <= times[4] - times[0] + 1e-6
    assert text.xy[0] == pytest.approx(fired["time_ns"] / 1e9 - times[0])


def test_many_alerts_on_a_panel_stay_readable(tmp_path: Path, spy_figures: list[Any]) -> None:
    """Twelve firings on one panel: every one a line; the labels short, one under the other,
    none overlapping another, none past the panel, the ones past the limit counted."""
    import otel_tunix
    from otel_tunix.metrics.alerts import ThresholdRule, above
    from otel_tunix.testing import reset

    reset()
    rule = ThresholdRule("loss_high", ("loss",), warning=above(5.0), description="too high")
    info = otel_tunix.configure(
        output_dir=tmp_path / "run", alerts=[rule], system_metrics=False, console_interval=0
    )
    logger = otel_tunix.get_metrics_logger()
    for n in range(48):  # high on every 4th step: 12 episodes
        logger.log_dict({"loss": 9.0 if n % 4 == 1 else 2.0}, step=n)
    otel_tunix.shutdown()
    assert info.output_dir is not None
    assert main(["plot", str(info.output_dir), "--metrics", "loss"]) == 0
    (fig,) = spy_figures
    (ax,) = fig.axes
    marks = [ln for ln in ax.lines if ln.get_label().startswith("_")]
    assert len(marks) == 12
    shown = plotting.MAX_MARK_LABELS
    texts = [t.get_text() for t in ax.texts]
    assert texts == [f"loss_high @ {4 * k + 1}" for k in range(shown)] + ["+6 more alerts"]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    panel = ax.get_window_extent(renderer)
    for i, box in enumerate(boxes):
        assert panel.y0 <= box.y0 and box.y1 <= panel.y1 + 1  # inside the panel's height
        for other in boxes[i + 1 :]:
            assert not box.overlaps(other)


def test_alerts_file_beside_each_metrics_file() -> None:
    d = Path("/runs/a")
    assert plotting.alerts_file(d / "metrics.jsonl") == d / "alerts.jsonl"
    assert plotting.alerts_file(d / "metrics-rank1.jsonl.gz") == d / "alerts-rank1.jsonl"
    assert plotting.alerts_file(d / "train_log.jsonl") == d / "alerts.jsonl"
