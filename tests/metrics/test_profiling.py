"""Profile captures (issue #39): an alert, or ``capture_profile()``, profiles the next steps
with the framework's real profiler (torch CPU activities; JAX on CPU), linked both ways with
the steps' OTel trace ids, capped, cooled down, never beside another profiler.

Which step is slow is the test's own bookkeeping: the loop logs a flag that the rule
watches, so no verdict depends on how fast this machine runs a step.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from processes import child_env
from run_files import RunFolder, read_jsonl

import otel_tunix
from otel_tunix.cli import main
from otel_tunix.metrics.alerts import Severity, ThresholdRule, above
from otel_tunix.metrics.profiling import PROFILE_PATH

torch = pytest.importorskip("torch")

RULE = ThresholdRule("slow_step", ("slow_step",), warning=above(0.5))
"""Fires on the step the loop flags (1.0), resolves on the next (0.0)."""


def _loop(steps: int, slow: set[int], before: Callable[[int], None] | None = None) -> None:
    """``steps`` steps of a small torch computation; a step in ``slow`` sleeps and flags
    itself, which fires :data:`RULE` inside that step."""
    a = torch.randn(64, 64)
    for i in range(steps):
        if before is not None:
            before(i)
        with otel_tunix.step(i):
            (a @ a).sum().item()
            if i in slow:
                time.sleep(0.05)
            otel_tunix.log({"slow_step": 1.0 if i in slow else 0.0}, step=i)


def _spans_by_step(run: RunFolder) -> dict[int, dict[str, Any]]:
    return {s["step"]: s for s in run.steps()}


@pytest.fixture(autouse=True)
def torch_profiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's profiler whatever else this process imported (JAX and Flax make ``auto``
    choose JAX's); the JAX tests ask for JAX's by name."""
    monkeypatch.setenv("OTEL_TUNIX_PROFILER", "torch")


@pytest.fixture
def profile_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setenv("OTEL_TUNIX_PROFILE_STEPS", "3")
    yield monkeypatch


def test_one_slow_step_gets_one_capture_of_the_steps_after_it(
    local_run: Callable[..., RunFolder],
    profile_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = local_run(alerts=[RULE])
    _loop(10, slow={4})
    otel_tunix.shutdown()

    files = sorted((run.path / "profiles").iterdir())
    assert [f.name for f in files] == ["capture-1-slow_step-step4.pt.trace.json"]
    rel = "profiles/capture-1-slow_step-step4.pt.trace.json"
    spans = _spans_by_step(run)
    profiled = [n for n, s in sorted(spans.items()) if PROFILE_PATH in s.get("attributes", {})]
    assert profiled == [5, 6, 7]
    assert {spans[n]["attributes"][PROFILE_PATH] for n in profiled} == {rel}

    # The profiler's own file, read as the Chrome trace JSON it is.
    trace = json.loads(files[0].read_text())
    assert trace["trace_id"] == spans[5]["trace_id"]  # custom_trace_id_callback
    meta = trace["otel_tunix"]
    assert meta["steps"] == [5, 6, 7]
    assert meta["trace_ids"] == [spans[n]["trace_id"] for n in (5, 6, 7)]
    names = {e.get("name") for e in trace["traceEvents"]}
    for n in (5, 6, 7):  # each step an annotation carrying its trace id
        assert f"train_step {n} trace_id={spans[n]['trace_id']}" in names
    assert not any(str(name).startswith("train_step 4 ") for name in names)

    fired = [a for a in read_jsonl(run.path / "alerts.jsonl") if a["tunix.alert.severity"] != "ok"]
    assert len(fired) == 1 and fired[0]["tunix.alert.step"] == 4
    assert fired[0][PROFILE_PATH] == rel

    profiles = run.summary()["profiles"]
    assert profiles["skipped"] == {}
    (cap,) = profiles["captures"]
    assert cap["path"] == rel and cap["status"] == "written" and cap["steps"] == [5, 6, 7]
    assert cap["reason"]["rule"] == "slow_step" and cap["reason"]["step"] == 4
    assert cap["trace_ids"] == meta["trace_ids"]

    # Starting the profiler (first profiled step) and stopping it (last) are components of
    # those steps, category profiling, and the ledger counts their time as such.
    assert [s["name"] for s in spans[5]["spans"]] == ["profiler_start"]
    assert [s["name"] for s in spans[7]["spans"]] == ["profiler_stop"]
    assert spans[6]["spans"] == [] and spans[4]["spans"] == []
    costs = [s for n in (5, 7) for s in spans[n]["spans"]]
    assert {s["category"] for s in costs} == {"profiling"}
    took = sum(s["end_ns"] - s["start_ns"] for s in costs) * 1e-9
    goodput = run.summary()["goodput"]
    assert goodput["badput_sec"]["profiling"] == pytest.approx(took, rel=1e-6)
    assert goodput["scopes"]["train"]["profiling"] == pytest.approx(took, rel=1e-6)

    # `otel-tunix summary` lists the capture with the alert that asked for it.
    assert main(["summary", str(run.path), "--json"]) == 0
    offline = json.loads(capsys.readouterr().out)
    assert offline["profiles"] == [{"rank": None, **cap}]
    # the offline ledger, from spans.jsonl, counts the same profiling time
    assert offline["goodput"]["badput_sec"]["profiling"] == pytest.approx(took, rel=1e-6)
    assert main(["summary", str(run.path)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        f"Profile captures: 1 (paths relative to the run folder) {rel}: train steps 5-7, "
        "asked by slow_step at step 4 (written)"
    ) in text


def test_cap_and_cooldown_count_what_they_skip(
    local_run: Callable[..., RunFolder], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_PROFILE_STEPS", "2")
    monkeypatch.setenv("OTEL_TUNIX_PROFILE_MAX_CAPTURES", "2")
    monkeypatch.setenv("OTEL_TUNIX_PROFILE_COOLDOWN_STEPS", "5")
    run = local_run(alerts=[RULE])
    # 2: captured (3, 4; ends with 5 steps begun); 6: 2 steps later, in the cooldown;
    # 12: captured (13, 14); 20: past the cap of 2.
    _loop(24, slow={2, 6, 12, 20})
    otel_tunix.shutdown()

    profiles = run.summary()["profiles"]
    assert [c["steps"] for c in profiles["captures"]] == [[3, 4], [13, 14]]
    assert [c["reason"]["step"] for c in profiles["captures"]] == [2, 12]
    assert profiles["skipped"] == {"cooldown": 1, "max_captures": 1}
    assert len(list((run.path / "profiles").iterdir())) == 2
    named = [a.get(PROFILE_PATH) for a in read_jsonl(run.path / "alerts.jsonl")]
    assert [p for p in named if p] == [c["path"] for c in profiles["captures"]]


def test_profile_on_alert_false_captures_nothing(
    local_run: Callable[..., RunFolder], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TUNIX_PROFILE_ON_ALERT", "false")
    run = local_run(alerts=[RULE])
    _loop(6, slow={1})
    otel_tunix.shutdown()

    assert not (run.path / "profiles").exists()
    assert all(PROFILE_PATH not in a for a in read_jsonl(run.path / "alerts.jsonl"))
    assert run.summary()["profiles"] == {"captures": [], "skipped": {}}
    assert all(PROFILE_PATH not in s.get("attributes", {}) for s in run.steps())


def test_a_running_profiler_is_left_alone(
    local_run: Callable[..., RunFolder], profile_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run = local_run(alerts=[RULE])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as theirs:
        _loop(6, slow={1})
    theirs.export_chrome_trace(str(tmp_path / "theirs.json"))  # still whole and usable
    otel_tunix.shutdown()

    assert json.loads((tmp_path / "theirs.json").read_text())["traceEvents"]
    profiles = run.summary()["profiles"]
    assert profiles["skipped"] == {"profiler_busy": 1}
    assert [c["status"] for c in profiles["captures"]] == ["skipped"]
    assert not (run.path / "profiles").exists()
    assert all(PROFILE_PATH not in s.get("attributes", {}) for s in run.steps())


def test_capture_profile_from_code(local_run: Callable[..., RunFolder]) -> None:
    run = local_run(alerts=False)
    asked: list[str | None] = []

    def before(i: int) -> None:
        if i == 3:
            asked.append(otel_tunix.capture_profile(steps=2))
            asked.append(otel_tunix.capture_profile(steps=2))  # one pending already

    _loop(8, slow=set(), before=before)
    otel_tunix.shutdown()

    assert asked == ["profiles/capture-1.pt.trace.json", None]
    spans = _spans_by_step(run)
    profiled = [n for n, s in sorted(spans.items()) if PROFILE_PATH in s.get("attributes", {})]
    assert profiled == [3, 4]
    trace = json.loads((run.path / asked[0]).read_text())
    assert trace["trace_id"] == spans[3]["trace_id"]
    profiles = run.summary()["profiles"]
    assert profiles["skipped"] == {"capture_running": 1}
    assert profiles["captures"][0]["reason"]["requested"] == "code"


def test_capture_still_running_at_shutdown_is_written(
    local_run: Callable[..., RunFolder],
) -> None:
    run = local_run(alerts=False)
    _loop(2, slow=set(), before=lambda i: otel_tunix.capture_profile(steps=5) and None)
    otel_tunix.shutdown()

    (cap,) = run.summary()["profiles"]["captures"]
    assert cap["status"] == "written" and cap["steps"] == [0, 1]
    assert json.loads((run.path / cap["path"]).read_text())["otel_tunix"]["steps"] == [0, 1]


def test_jax_capture_carries_the_trace_ids(local_run: Callable[..., RunFolder]) -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    run = local_run(alerts=False)
    f = jax.jit(lambda x: x @ x)
    for i in range(5):
        if i == 1:  # torch is imported in this process too: JAX's profiler by name
            assert otel_tunix.capture_profile(steps=2, framework="jax") == "profiles/capture-1"
        with otel_tunix.step(i):
            f(jnp.ones((32, 32))).block_until_ready()
    otel_tunix.shutdown()

    spans = _spans_by_step(run)
    folder = run.path / "profiles" / "capture-1"
    (perfetto,) = folder.rglob("perfetto_trace.json.gz")
    events = json.loads(gzip.decompress(perfetto.read_bytes()))["traceEvents"]
    steps = {
        int(e["args"]["step_num"]): e["args"]["trace_id"]
        for e in events
        if e.get("name") == "train_step"
    }
    assert steps == {n: spans[n]["trace_id"] for n in (1, 2)}
    assert json.loads((folder / "otel_tunix.json").read_text())["steps"] == [1, 2]
    assert spans[1]["attributes"][PROFILE_PATH] == "profiles/capture-1"
    assert PROFILE_PATH not in spans[3].get("attributes", {})


def test_jax_trace_already_running_is_left_alone(
    local_run: Callable[..., RunFolder], tmp_path: Path
) -> None:
    jax = pytest.importorskip("jax")

    run = local_run(alerts=False)
    jax.profiler.start_trace(str(tmp_path / "theirs"))
    try:
        assert otel_tunix.capture_profile(steps=1, framework="jax") == "profiles/capture-1"
        with otel_tunix.step(0):
            pass
    finally:
        jax.profiler.stop_trace()  # theirs, still running: ours did not stop it
    otel_tunix.shutdown()

    assert run.summary()["profiles"]["skipped"] == {"profiler_busy": 1}
    assert not (run.path / "profiles").exists()


def test_the_alerts_log_record_and_span_event_name_the_capture(
    local_run: Callable[..., RunFolder], profile_env: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemoryLogRecordExporter()
    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    spans_out = InMemorySpanExporter()
    run = local_run(
        alerts=[RULE], logger_provider=lp, span_processors=[SimpleSpanProcessor(spans_out)]
    )
    _loop(6, slow={1})
    otel_tunix.shutdown()

    rel = "profiles/capture-1-slow_step-step1.pt.trace.json"
    fired, resolved = (r.log_record for r in exporter.get_finished_logs())
    assert fired.attributes is not None and fired.attributes[PROFILE_PATH] == rel
    assert resolved.attributes is not None and PROFILE_PATH not in resolved.attributes
    spans = _spans_by_step(run)
    assert fired.trace_id == int(spans[1]["trace_id"], 16)  # logged inside step 1
    assert (run.path / rel).is_file()
    # the step span's tunix.alert events: the fire names the capture, the resolve does not
    events = {
        s.attributes["tunix.step"]: [dict(e.attributes or {}) for e in s.events]
        for s in spans_out.get_finished_spans()
        if s.name == "train_step" and s.attributes is not None
    }
    assert [e.get(PROFILE_PATH) for e in events[1]] == [rel]
    assert [e.get(PROFILE_PATH) for e in events[2]] == [None]
    assert events[2][0]["tunix.alert.severity"] == "ok"


def test_a_rule_can_opt_out(local_run: Callable[..., RunFolder]) -> None:
    quiet = ThresholdRule("slow_step", ("slow_step",), warning=above(0.5), profile=False)
    run = local_run(alerts=[quiet])
    _loop(5, slow={1})
    otel_tunix.shutdown()

    assert len(read_jsonl(run.path / "alerts.jsonl")) == 2  # fired and resolved
    assert run.summary()["profiles"] == {"captures": [], "skipped": {}}
    assert not (run.path / "profiles").exists()


def test_a_file_in_the_run_folder_asks_a_running_job(
    local_run: Callable[..., RunFolder],
) -> None:
    run = local_run(alerts=False)
    stale = run.path / "capture_profile-old"  # another name: no request
    stale.write_text("")

    def before(i: int) -> None:
        if i == 2:
            (run.path / "capture_profile").write_text("2\n")
        if i == 3:
            assert otel_tunix.force_flush()

    _loop(8, slow=set(), before=before)
    otel_tunix.shutdown()

    (cap,) = run.summary()["profiles"]["captures"]
    assert cap["reason"]["requested"] == "file" and cap["reason"]["file"] == "capture_profile"
    # Made before step 2 opened, seen by the worker at its next batch (which may hold step
    # 1, processed late), at the latest at the flush before step 3: capture from there.
    assert cap["steps"] in ([2, 3], [3, 4])
    assert cap["status"] == "written"
    spans = _spans_by_step(run)
    profiled = [n for n, s in sorted(spans.items()) if PROFILE_PATH in s.get("attributes", {})]
    assert profiled == cap["steps"]
    assert (run.path / "capture_profile").exists()  # left for the other ranks


SEEN: list[tuple[str, float]] = []
"""What :class:`_Watching` was given, in order (the test's own record)."""


@dataclass(frozen=True)
class _Watching(ThresholdRule):
    """A threshold rule that writes down every value it is given."""

    def level(self, value: float, history: Sequence[float]) -> Severity:
        SEEN.append((self.name, value))
        return super().level(value, history)


def test_no_rule_sees_the_timings_of_the_profiled_steps(
    local_run: Callable[..., RunFolder],
) -> None:
    SEEN.clear()
    watching = _Watching("watch", ("perf/train/step_time_sec",), warning=above(1e9))
    run = local_run(alerts=[watching])

    def before(i: int) -> None:
        if i == 3:
            otel_tunix.capture_profile(steps=2)

    _loop(8, slow=set(), before=before)
    otel_tunix.shutdown()

    (cap,) = run.summary()["profiles"]["captures"]
    assert cap["steps"] == [3, 4]
    logged = {
        m["step"]: m["metrics"]["perf/train/step_time_sec"]
        for m in run.metrics()
        if "perf/train/step_time_sec" in m.get("metrics", {})
    }
    assert sorted(logged) == list(range(8))  # logged as ever: only the rules skip them
    assert [v for _, v in SEEN] == [logged[n] for n in (0, 1, 2, 5, 6, 7)]


def test_shut_down_from_another_thread_leaves_the_profiler_alone(
    local_run: Callable[..., RunFolder],
) -> None:
    jax = pytest.importorskip("jax")

    run = local_run(alerts=False)
    assert otel_tunix.capture_profile(steps=5, framework="jax") == "profiles/capture-1"
    with otel_tunix.step(0):
        pass
    closer = threading.Thread(target=otel_tunix.shutdown)  # as the SIGTERM handler does
    closer.start()
    closer.join()

    profiles = run.summary()["profiles"]
    assert profiles["skipped"] == {"unfinished": 1}
    assert [c["status"] for c in profiles["captures"]] == ["failed"]
    jax.profiler.stop_trace()  # still running, left for its own thread to stop


def test_a_profiles_link_planted_in_the_run_folder_is_refused(tmp_path: Path) -> None:
    from otel_tunix.settings.parsing import ConfigurationError

    (tmp_path / "outside").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "profiles").symlink_to(tmp_path / "outside")
    with pytest.raises(ConfigurationError) as err:
        otel_tunix.configure(output_dir=run, system_metrics=False)
    assert "profiles" in str(err.value)
    assert list((tmp_path / "outside").iterdir()) == []


JAX_LOOP = """
import sys
import jax, jax.numpy as jnp
import otel_tunix
from otel_tunix.metrics.alerts import ThresholdRule, above

otel_tunix.configure(output_dir=sys.argv[1], system_metrics=False,
                     alerts=[ThresholdRule("slow_step", ("slow_step",), warning=above(0.5))])
f = jax.jit(lambda x: x @ x)
for i in range(7):
    with otel_tunix.step(i):
        f(jnp.ones((32, 32))).block_until_ready()
        otel_tunix.log({"slow_step": 1.0 if i == 2 else 0.0}, step=i)
otel_tunix.shutdown()
assert "torch" not in sys.modules
"""


def test_a_jax_loop_gets_jax_captures_on_its_alerts(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    out = tmp_path / "run"
    env = child_env(OTEL_TUNIX_QUIET="true", OTEL_TUNIX_PROFILE_STEPS="2")  # profiler: auto
    proc = subprocess.run(
        [sys.executable, "-c", JAX_LOOP, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (cap,) = json.loads((out / "summary.json").read_text())["profiles"]["captures"]
    assert cap["framework"] == "jax" and cap["steps"] == [3, 4] and cap["status"] == "written"
    (perfetto,) = (out / cap["path"]).rglob("perfetto_trace.json.gz")
    events = json.loads(gzip.decompress(perfetto.read_bytes()))["traceEvents"]
    found = [e["args"]["trace_id"] for e in events if e.get("name") == "train_step"]
    spans = {s["step"]: s for s in RunFolder(out).steps()}
    assert found == [spans[3]["trace_id"], spans[4]["trace_id"]]


def test_a_profiler_that_fails_is_counted_and_stopped(
    local_run: Callable[..., RunFolder],
) -> None:
    run = local_run(alerts=False)
    (run.path / "profiles").write_text("a file where the folder goes\n")  # the export fails
    otel_tunix.capture_profile(steps=1)
    _loop(3, slow=set())
    assert not torch.autograd.profiler._is_profiler_enabled  # not left running
    otel_tunix.shutdown()

    profiles = run.summary()["profiles"]
    assert profiles["skipped"] == {"failed": 1}
    (cap,) = profiles["captures"]
    assert cap["status"] == "failed" and cap["steps"] == [0] and cap["error"]
    assert len(run.steps()) == 3  # the loop went on, every step recorded


def test_tunix_profiler_and_ours_never_run_together(
    local_run: Callable[..., RunFolder],
) -> None:
    tunix_profiler = pytest.importorskip("tunix.sft.profiler").Profiler
    run = local_run(alerts=False)
    seen: list[bool] = []

    tunix_profiler._is_active = True  # Tunix's window is open
    try:
        otel_tunix.capture_profile(steps=1, framework="jax")
        with otel_tunix.step(0):
            pass
    finally:
        tunix_profiler._is_active = False
    otel_tunix.capture_profile(steps=2, framework="jax")
    for i in (1, 2, 3):
        with otel_tunix.step(i):
            seen.append(tunix_profiler._is_active)  # held while ours runs: Tunix skips
    otel_tunix.shutdown()

    assert seen == [True, True, False]
    profiles = run.summary()["profiles"]
    assert profiles["skipped"] == {"profiler_busy": 1}
    assert [(c["status"], c["steps"]) for c in profiles["captures"]] == [
        ("skipped", []),
        ("written", [1, 2]),
    ]
