"""The README as a new user meets it: its first commands, and its quick start run as written."""

from __future__ import annotations

import json
import queue
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _quick_start() -> str:
    section = README[README.index("## Quick start") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_starts_with_the_demo_and_the_tests() -> None:
    lines = README.splitlines()
    assert lines[:3] == ["# otel-tunix", "", "```bash"]
    assert lines[3].startswith("make demo ") and lines[4].startswith("make test ")
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: .*\n\t\$\(BIN\)/otel-tunix demo$", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_quick_start_runs_as_written() -> None:
    # What the quick start takes as given: a step count, a data iterator, a queue the
    # loop waits on, and a train step returning the loss.
    q: queue.Queue[int] = queue.Queue()
    for i in range(9):
        q.put(i)
    losses = {}

    def train_step(batch: int) -> float:
        losses[batch] = 1.0 / (batch + 1)
        return losses[batch]

    code = _quick_start()
    exec(compile(code, "README.md", "exec"), {"steps": 9, "it": iter(range(9)), "q": q,
                                               "train_step": train_step})  # fmt: skip

    lines = [json.loads(x) for x in Path("runs/a/spans.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step"]
    assert [x["step"] for x in steps] == [0, 4, 8]  # sampling_rate=4
    for x in steps:  # the blocked component is one of the components recorded
        assert set(x["components"]) == {"train_data_load", "train_queue_wait", "train_step_compute"}
        assert x["components"]["train_queue_wait"]["blocked_time_sec"] >= 0
    assert lines[0]["resource"]["service.name"] == "sft-demo"
    # the config stays home: config.json has it, the resource (sent with every export) not
    assert not any(k.startswith("tunix.config.") for k in lines[0]["resource"])
    (folder,) = Path("otel-tunix-runs").iterdir()  # the run folder, besides the extra copy
    assert json.loads((folder / "config.json").read_text()) == {"lr": 3e-4, "batch_size": 32}
    metrics = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    logged = {m["step"]: m["metrics"]["loss"] for m in metrics if "loss" in m.get("metrics", {})}
    assert logged == losses
