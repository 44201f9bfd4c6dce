"""A new user's first steps on a fresh clone, as the README writes them: ``make demo`` in a
copy of the checkout (its own ``.venv``, the ``demo`` extra only, ``otel-tunix`` not on the
``PATH``), then what the demo prints next, then the README's next steps in their order; in
that same environment the RL demo, a torch loop of the user's own, and the collector path
without its extra.

A real ``make demo`` (a fresh virtual environment, torch's CPU wheel from the machine's
package caches), so it takes a while."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from processes import shell_env

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("make") is None, reason="needs make"),
]


def _clone(dest: Path) -> Path:
    """The files of a fresh clone that ``make demo`` reads, copied to ``dest``."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "Makefile"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "otel_tunix", dest / "otel_tunix", ignore=shutil.ignore_patterns("__pycache__")
    )
    return dest


def _user_env() -> dict[str, str]:
    """A shell's environment: no virtual environment active, nothing of otel-tunix set."""
    env = {
        k: v
        for k, v in shell_env().items()
        if not k.startswith(("OTEL_", "PYTEST_", "VIRTUAL_ENV", "PYTHON"))
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and "venv" not in p
    )
    # The same packages, their bytecode compiled at first import rather than by pip (torch's
    # thousands of modules): most of the install's time, and the suite's.
    env["PIP_NO_COMPILE"] = "1"
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)


def _one_line_naming(done: subprocess.CompletedProcess[str], extra: str) -> None:
    """A missing extra: exit status 2 and one line on stderr that names it, no traceback."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"pip install 'otel-tunix[{extra}]'" in lines[0], lines[0]


def _analysis_lines() -> list[str]:
    """The commands of the README's "Local analysis" block, in order."""
    section = README[README.index("## Local analysis") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_a_fresh_clone_from_make_demo_to_the_next_steps(tmp_path: Path) -> None:
    clone = _clone(tmp_path / "otel-tunix")
    env = _user_env()
    assert shutil.which("otel-tunix", path=env["PATH"]) is None

    # The README's first command, as written; torch from the machine's package caches
    # (TORCH_INDEX= : no download from PyTorch's index here), Python as the user's.
    first = README.splitlines()[3]
    assert first.startswith("make demo ")
    base = getattr(sys, "_base_executable", sys.executable)
    made = _run(["make", "demo", "TORCH_INDEX=", f"PY={base}"], clone, env)
    assert made.returncode == 0, made.stderr[-4000:]
    assert "Traceback" not in made.stderr

    # The default demo (seed 0, 300 steps: the spike needs the full schedule) says its loss
    # spike, records it in the run folder's alerts.jsonl, and `otel-tunix plot` (the
    # analysis extra, this test's own environment here) draws it on the loss panel.
    runs = list((clone / "otel-tunix-runs").iterdir())
    assert len(runs) == 1
    _the_spike_is_said_recorded_and_drawn(runs[0], made.stdout)

    # What the demo says to run next is its last line, and it runs from here as printed.
    last = made.stdout.strip().splitlines()[-1]
    assert last.startswith("next: .venv/bin/otel-tunix summary "), last
    commands = [shlex.split(c) for c in last.removeprefix("next: ").split("   ·   ")]
    assert [c[1] for c in commands] == ["summary", "goodput"]
    folder = clone / commands[0][2]  # as the demo names it: under the working folder
    assert folder.parent == clone / "otel-tunix-runs" and folder.is_dir()
    for cmd in commands:
        done = _run(cmd, clone, env)
        assert done.returncode == 0, done.stderr
        assert "Goodput" in done.stdout and "…" not in done.stdout  # whole when piped

    # The README's next steps, in order, after `source .venv/bin/activate` (as it says):
    # summary and goodput run; plot and convert need extras the demo did not install, and
    # say so in one line.
    active = {**env, "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"}
    run_id = folder.name
    ran = []
    for line in _analysis_lines():
        args = shlex.split(line.replace("<run id>", run_id), comments=True)
        args = [a for a in args if not (a.startswith("[") and a.endswith("]"))]  # optional
        args = [str(folder) if a in ("RUN_A", "RUN_B") else a for a in args]
        assert args[0] == "otel-tunix"
        done = _run(args, clone, active)
        ran.append(args[1])
        if args[1] in ("summary", "goodput"):
            assert done.returncode == 0, done.stderr
        elif args[1] == "plot":
            _one_line_naming(done, "analysis")
        elif args[1] == "convert":
            _one_line_naming(done, "perfetto")
    assert ran == ["summary", "summary", "goodput", "plot", "convert"]

    # The RL demo in the environment `make demo` built (what it imports is in the extra).
    rl_demo = ".venv/bin/otel-tunix demo --rl --steps 4 --no-progress --console-interval 0"
    rl = _run([*rl_demo.split(), "--output-dir", str(tmp_path / "rl")], clone, env)
    assert rl.returncode == 0, rl.stderr[-4000:]
    assert "mean reward" in rl.stdout
    assert rl.stdout.strip().splitlines()[-1].startswith("next: .venv/bin/otel-tunix summary ")

    # A torch loop of the user's own, in that environment, with the model instrumented.
    own = textwrap.dedent(
        """
        import torch, otel_tunix
        from otel_tunix.instrumentation.torch import instrument_model
        otel_tunix.configure(output_dir="own")
        model = instrument_model(torch.nn.Linear(4, 1))
        for n in range(3):
            with otel_tunix.step(n):
                model(torch.zeros(2, 4)).sum().backward()
        otel_tunix.shutdown()
        """
    )
    done = _run([".venv/bin/python", "-c", own], clone, env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "forward" in (clone / "own" / "spans.jsonl").read_text()

    # The collector path without the otlp extra: one line that names it.
    to_collector = {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    done = _run([".venv/bin/otel-tunix", "demo", "--steps", "2"], clone, to_collector)
    _one_line_naming(done, "otlp")


def _the_spike_is_said_recorded_and_drawn(out: Path, stdout: str) -> None:
    """The demo's loss spike: the step where metrics.jsonl has the loss above the uniform
    guess is the one the demo names, its alert's and the loss panel's mark."""
    import json
    import math

    from otel_tunix.demos.sft import SPIKE_TEXT

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    loss = {r["step"]: r["metrics"]["loss"] for r in rows if "loss" in r.get("metrics", {})}
    late = [n for n, v in loss.items() if n >= 5 and v > math.log(256)]
    assert late, "no spike with the default seed: update README 'The demo' and spike_note"
    spike = max(late, key=loss.__getitem__)
    assert f"loss spike: {loss[spike]:.2f} at step {spike}" in stdout
    alerts = [json.loads(x) for x in (out / "alerts.jsonl").read_text().splitlines()]
    # (on a loaded machine a step-time rule may fire too: only the loss alert is the demo's)
    (alert,) = [a for a in alerts if a["tunix.alert.metric"] == "loss"]
    assert alert["tunix.alert.step"] == spike
    assert alert["tunix.alert.value"] == pytest.approx(loss[spike])
    if not (importlib.util.find_spec("pandas") and importlib.util.find_spec("matplotlib")):
        return  # (this test's environment has no analysis extra: no plot to look at)
    from otel_tunix.analysis.plotting import PlotSpec, load_runs, render

    spec = PlotSpec()  # what `otel-tunix plot RUN` draws
    (table,) = load_runs([out], spec)
    table.poll()
    fig = render([table], spec).figure
    panels = {ax.get_title(loc="left"): ax for ax in fig.axes}
    (text,) = panels["loss"].texts
    assert text.get_text() == SPIKE_TEXT and text.xy[0] == spike
    assert [list(ln.get_xdata()) for ln in panels["loss"].lines[1:]] == [[spike, spike]]
    others = [t.get_text() for name, ax in panels.items() if name != "loss" for t in ax.texts]
    assert SPIKE_TEXT not in others  # (other panels: the step-time alerts of a loaded machine)
