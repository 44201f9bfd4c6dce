"""Tunix integration on real google-tunix PeftTrainer runs (a two-layer flax nnx MLP, CPU)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from conftest import xprof_annotations

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")
optax = pytest.importorskip("optax")
nnx = pytest.importorskip("flax.nnx")
peft_trainer = pytest.importorskip("tunix.sft.peft_trainer")
tunix_metrics_logger = pytest.importorskip("tunix.sft.metrics_logger")

from otel_tunix.instrumentation.jax import JaxInstrumentor  # noqa: E402
from otel_tunix.instrumentation.tunix import (  # noqa: E402
    MISSING_COUNT,
    PROFILER_STEP,
    OTelLoggingBackend,
    OTelPerfTracer,
    TunixInstrumentor,
    parse_event,
)
from otel_tunix.model.metric_spec import MODE_ATTRIBUTE as MODE  # noqa: E402
from otel_tunix.settings import attributes as attr  # noqa: E402
from otel_tunix.testing import capture  # noqa: E402

pytestmark = pytest.mark.slow  # importing tunix alone takes a few seconds

STEPS = 20
EVAL_EVERY = 10
EVAL_BATCHES = 2

SFT_SCRIPT = """
import jax.numpy as jnp, numpy as np, optax
from flax import nnx
from tunix.sft import peft_trainer


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(8, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.l1(x)))


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {"x": rng.normal(size=(4, 8)).astype(np.float32),
         "y": rng.normal(size=(4, 1)).astype(np.float32)}
        for _ in range(n)
    ]


def make_trainer(steps, **config):
    cfg = peft_trainer.TrainingConfig(eval_every_n_steps=10, max_steps=steps, **config)
    opt = optax.inject_hyperparams(optax.sgd)(learning_rate=1e-2)
    return peft_trainer.PeftTrainer(MLP(nnx.Rngs(0)), opt, cfg).with_loss_fn(loss_fn)
"""

_ns: dict[str, Any] = {}
exec(compile(SFT_SCRIPT, "<sft>", "exec"), _ns)  # the same model code the subprocess runs
make_trainer, batches = _ns["make_trainer"], _ns["batches"]


@dataclass
class Run:
    spans: list[Any]
    metrics: dict[str, list[Any]]
    units: dict[str, str]
    summaries: list[Any]
    losses: list[float]
    eval_losses: list[float]
    run_dir: Path
    annotations: list[tuple[str, Any]]  # Tunix's XProf step annotations (name, step_num)


def _parent_name(spans: list[Any], span: Any) -> str | None:
    by_id = {s.context.span_id: s.name for s in spans}
    return by_id.get(span.parent.span_id) if span.parent else None


def _values(run: Run, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
    return {
        tuple(sorted(dict(p.attributes).items())): getattr(p, "value", None) or p.sum
        for p in run.metrics.get(name, [])
    }


@pytest.fixture(scope="module")
def instrumented_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One unmodified PeftTrainer run under TunixInstrumentor + JaxInstrumentor."""
    import orbax.checkpoint as ocp

    tmp = tmp_path_factory.mktemp("tunix")
    run_dir = tmp / "run"
    with capture(output_dir=run_dir) as cap:
        tunix_inst, jax_inst = TunixInstrumentor(), JaxInstrumentor()
        tunix_inst.instrument()
        jax_inst.instrument()
        try:
            trainer = make_trainer(
                STEPS,
                checkpoint_root_directory=str(tmp / "ckpt"),
                checkpointing_options=ocp.CheckpointManagerOptions(
                    save_interval_steps=EVAL_EVERY, max_to_keep=1
                ),
            )
            data = batches(STEPS + 5)
            with xprof_annotations() as annotations:
                trainer.train(data, eval_ds=data[:EVAL_BATCHES])
            history = trainer.metrics_logger.get_metric_history
            losses = [float(v) for v in history("", "loss", "train")]
            eval_losses = [float(v) for v in history("", "loss", "eval")]
        finally:
            tunix_inst.uninstrument()
            jax_inst.uninstrument()
        spans = cap.spans()
        metrics = cap.metrics()
        units = cap.metric_units()
        summaries = list(cap.summaries)
    return Run(spans, metrics, units, summaries, losses, eval_losses, run_dir, annotations)


def test_one_train_step_per_iteration_with_its_components(instrumented_run: Run) -> None:
    spans = instrumented_run.spans
    steps = [s for s in spans if s.name == "train_step"]
    # numbered as Tunix logs them: step n is the iteration that makes the n-th update
    assert sorted(s.attributes[attr.STEP] for s in steps) == list(range(1, STEPS + 1))
    assert all(s.attributes["tunix.train_step"] == s.attributes[attr.STEP] for s in steps)
    # and the number Tunix's XProf annotation gives the same iteration (0-based), beside it
    assert all(s.attributes[PROFILER_STEP] == s.attributes[attr.STEP] - 1 for s in steps)
    xprof = [n for name, n in instrumented_run.annotations if name == "train"]
    # Tunix annotates one more iteration: the last fetch, which finds max_steps reached
    assert sorted(s.attributes[PROFILER_STEP] for s in steps) == xprof[:STEPS]
    assert all(s.attributes[attr.SCOPE] == "train" for s in steps)
    per_step = Counter(
        (s.name, s.attributes[attr.STEP]) for s in spans if s.attributes.get(attr.SCOPE) == "train"
    )
    for n in range(1, STEPS + 1):
        assert per_step[("train_data_load", n)] == 1
        assert per_step[("peft_train_step", n)] == 1  # v1 and v2 spans merged into one
    for s in spans:
        if s.name in ("train_data_load", "peft_train_step", "checkpoint_save"):
            assert _parent_name(spans, s) == "train_step"


def test_train_step_ends_on_device_and_compiles_once(instrumented_run: Run) -> None:
    spans = instrumented_run.spans
    train = [s for s in spans if s.name == "peft_train_step"]
    for s in train:
        assert s.attributes[attr.DEVICE_END] is True
        assert s.end_time >= s.start_time + int(s.attributes[attr.HOST_DURATION] * 1e9)
    compiles = [
        s for s in spans if s.name == "jax_compile" and _parent_name(spans, s) == "peft_train_step"
    ]
    # first step only (google-tunix 0.1.7 compiles one program there, Tunix HEAD two)
    assert compiles and {s.attributes[attr.STEP] for s in compiles} == {1}


def test_inflight_wait_is_blocked_and_checkpoints_are_components(instrumented_run: Run) -> None:
    spans = instrumented_run.spans
    waits = [s for s in spans if s.name == "train_inflight_wait"]
    assert waits and all(s.attributes[attr.TIME_KIND] == attr.KIND_BLOCKED for s in waits)
    # max_inflight_computations=2: from the third step on the throttler waits every step
    assert {s.attributes[attr.STEP] for s in waits} == set(range(3, STEPS + 1))
    saves = [s.attributes[attr.STEP] for s in spans if s.name == "checkpoint_save"]
    assert saves and EVAL_EVERY in saves and STEPS in saves  # Tunix saves step n as n
    assert len(saves) < STEPS  # only the steps that saved


def test_evaluation_runs_as_eval_steps(instrumented_run: Run) -> None:
    spans = instrumented_run.spans
    eval_steps = [s for s in spans if s.name == "eval_step"]
    runs = 1 + STEPS // EVAL_EVERY  # before training, then every EVAL_EVERY steps
    assert len(eval_steps) == runs * EVAL_BATCHES
    compute = [s for s in spans if s.name == "eval_step_compute"]
    assert len(compute) == runs * EVAL_BATCHES
    assert all(s.attributes[attr.SCOPE] == "eval" for s in compute)
    assert all(s.attributes.get(attr.DEVICE_END) for s in compute)
    assert not any(
        s.name.startswith("eval_") and s.attributes[attr.SCOPE] == "train" for s in spans
    )


def test_step_accounting_and_counters(instrumented_run: Run) -> None:
    run = instrumented_run
    assert _values(run, "tunix.steps") == {
        (("scope", "eval"),): (1 + STEPS // EVAL_EVERY) * EVAL_BATCHES,
        (("scope", "train"),): STEPS,
    }
    busy = _values(run, "tunix.component.busy_time")
    assert busy[(("component", "peft_train_step"), ("scope", "train"))] > 0
    blocked = _values(run, "tunix.component.blocked_time")
    assert blocked[(("component", "train_inflight_wait"), ("scope", "train"))] >= 0
    train = [s for s in run.summaries if s.scope == "train"]
    assert len(train) == STEPS
    # host windows: consecutive steps do not overlap (device work runs past them, apart)
    train.sort(key=lambda s: s.start_ns)
    for a, b in itertools.pairwise(train):
        assert a.end_ns <= b.start_ns
    for summary in train:
        assert summary.busy_time_sec + summary.blocked_time_sec + summary.idle_time_sec == (
            pytest.approx(summary.step_time_sec)
        )
        assert "peft_train_step" in summary.components
    assert run.units["tunix.component.busy_time"] == "s"


def test_tunix_metrics_become_instruments_with_units(instrumented_run: Run) -> None:
    run = instrumented_run
    loss = _values(run, "tunix.training.loss")
    # gauges keep the last value; Tunix logs each step one step late and flushes at close()
    assert loss[((MODE, "train"),)] == pytest.approx(run.losses[-1])
    assert loss[((MODE, "eval"),)] == pytest.approx(run.eval_losses[-1])
    perplexity = _values(run, "tunix.training.perplexity")[((MODE, "train"),)]
    assert perplexity == pytest.approx(np.exp(run.losses[-1]), rel=1e-5)
    lr = _values(run, "tunix.training.learning_rate")[((MODE, "train"),)]
    assert lr == pytest.approx(1e-2)
    assert _values(run, "tunix.training.gradient.norm")[((MODE, "train"),)] > 0
    # Tunix's own OTel double-write names (tunix/sft/metrics_logger.py, _OTEL_KNOWN_METRICS)
    for name in (
        "tunix.training.loss", "tunix.training.perplexity", "tunix.training.learning_rate",
        "tunix.training.gradient.norm",
    ):  # fmt: skip
        assert run.units[name] == "1"
    assert not any(name.startswith(("/", "jax", "tunix./")) for name in run.metrics)
    assert "loss" not in run.metrics  # not published a second time by the logger's backend


def test_tunix_metrics_land_in_metrics_jsonl(instrumented_run: Run) -> None:
    lines = (instrumented_run.run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]
    losses = {r["step"]: r["metrics"]["loss"] for r in records if "loss" in r["metrics"]}
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert [losses[s] for s in sorted(losses)] == pytest.approx(instrumented_run.losses)
    assert any("eval/loss" in r["metrics"] for r in records)
    # joinable by step: Tunix's loss of step n and otel-tunix's figures of the step n span
    perf = {
        r["step"] for r in records if "perf/train/peft_train_step/busy_time_sec" in r["metrics"]
    }
    spans = {s.attributes[attr.STEP] for s in instrumented_run.spans if s.name == "train_step"}
    assert perf == spans == set(losses)


def test_the_tunix_under_test_is_the_one_imported() -> None:
    """``TUNIX_UNDER_TEST`` (see conftest.py) puts another Tunix first: it is the one used."""
    import tunix

    under_test = os.environ.get("TUNIX_UNDER_TEST")
    if under_test:
        assert Path(tunix.__file__).resolve().is_relative_to(Path(under_test).resolve())


def test_every_patch_target_resolves_on_this_tunix() -> None:
    """Each patch finds its target in the Tunix under test (a module this Tunix does not
    have, such as HEAD's orchestrator on 0.1.7, is never imported, so never patched)."""
    import importlib
    import importlib.util

    from otel_tunix.instrumentation.tunix import PATCHES, _resolve

    def exists(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its parent package is not there
            return False

    present = [p for p in PATCHES if exists(p.module)]
    assert len(present) >= 9  # the SFT and RL ones, on every Tunix
    for patch in present:
        module = importlib.import_module(patch.module)
        assert _resolve(module, patch.targets) is not None, (patch.module, patch.targets)


def test_a_target_this_tunix_lacks_is_one_warning_and_a_count_in_summary_json(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A future Tunix without ``InflightThrottler.wait_for_next``: every other patch
    applies, one warning names what the run will lack, summary.json counts it."""
    from tunix.sft import inflight_throttler

    import otel_tunix

    monkeypatch.delattr(inflight_throttler.InflightThrottler, "wait_for_next")
    inst = TunixInstrumentor()
    otel_tunix.configure(output_dir=tmp_path / "run", console_interval=0)
    inst.instrument()
    try:
        assert hasattr(peft_trainer.PeftTrainer.train, "__wrapped__")
        warnings = [r.getMessage() for r in caplog.records if "InflightThrottler" in r.getMessage()]
        assert len(warnings) == 1
        assert "train_inflight_wait" in warnings[0]  # what goes missing
        with otel_tunix.step(1):  # a run with no step leaves no folder
            pass
    finally:
        otel_tunix.shutdown()
        inst.uninstrument()
    safety = json.loads((tmp_path / "run" / "summary.json").read_text())["safety"]
    assert safety[MISSING_COUNT] == 1


def test_uninstrument_restores_tunix() -> None:
    inst = TunixInstrumentor()
    inst.instrument()
    assert hasattr(peft_trainer.PeftTrainer.train, "__wrapped__")
    inst.uninstrument()
    assert not hasattr(peft_trainer.PeftTrainer.train, "__wrapped__")
    trainer = make_trainer(2)
    assert type(trainer._perf_tracer).__name__ == "NoopTracer"


def test_drop_in_tracer_and_backend_without_instrumentor(tmp_path: Path) -> None:
    """``perf_tracer=`` and ``custom_backend`` alone: each train step is a step of its own."""
    tracer = OTelPerfTracer()
    options = tunix_metrics_logger.MetricsLoggerOptions(
        log_dir=str(tmp_path / "tb"), backend_kwargs={"custom_backend": [OTelLoggingBackend]}
    )
    with capture() as cap:
        cfg = peft_trainer.TrainingConfig(
            eval_every_n_steps=100, max_steps=5, metrics_logging_options=options
        )
        opt = optax.sgd(1e-2)
        trainer = peft_trainer.PeftTrainer(
            _ns["MLP"](nnx.Rngs(0)), opt, cfg, perf_tracer=tracer, perf_tracer_v2=tracer.v2
        ).with_loss_fn(_ns["loss_fn"])
        trainer.train(batches(8))
        spans = cap.spans()
        metrics = cap.metrics()
    steps = [s for s in spans if s.name == "train_step"]
    assert len(steps) == 5
    train = [s for s in spans if s.name == "peft_train_step"]
    assert len(train) == 5 and all(s.attributes[attr.DEVICE_END] for s in train)
    assert {dict(p.attributes)[MODE] for p in metrics["tunix.training.loss"]} == {"train"}
    assert (
        "tunix.training.learning_rate" not in metrics
    )  # plain optax.sgd: Tunix logs no learning rate


def test_tracer_protocol_groups_tags_and_v1_v2_merge() -> None:
    tracer = OTelPerfTracer(devices=jax.devices())
    x = jnp.ones((32, 32))
    with capture() as cap:
        for _ in range(2):
            with tracer.span_group("global_step"):  # an RL global step: a rl/learner step
                with tracer.span_group("mini_batch_step"):
                    with (
                        tracer.span("rollout", jax.devices()) as span,
                        tracer.v2.span(
                            "rollout", jax.devices(), tags={"role": "rollout"}
                        ) as span_v2,
                    ):
                        out = x @ x
                        span.device_end([out])
                        span_v2.async_end([out])
                with tracer.span("weight_sync", tracer.all_devices):
                    pass
        exported = tracer.export()  # Tunix's perf metrics of the last global step
        with tracer.v2.span("peft_train", tags={"step": 41}) as s:  # no step open: a step
            s.async_end(jnp.ones(3) * 2)
        spans = cap.spans()
    names = Counter((s.name, s.attributes[attr.SCOPE]) for s in spans)
    assert names == {
        ("rl/learner_step", "rl/learner"): 2,
        ("mini_batch_step", "rl/learner"): 2,
        ("rollout", "rl/learner"): 2,
        ("weight_sync", "rl/learner"): 2,
        ("train_step", "train"): 1,
        ("peft_train_step", "train"): 1,  # Tunix's v2 name of the v1 peft_train_step
    }
    rollout = [s for s in spans if s.name == "rollout"]
    assert all(_parent_name(spans, s) == "mini_batch_step" for s in rollout)
    assert all(s.attributes[attr.DEVICE_END] for s in rollout)
    assert all(s.attributes["tunix.role"] == "rollout" for s in rollout)  # v2 tags, merged
    train = next(s for s in spans if s.name == "peft_train_step")
    assert train.attributes["tunix.global_step"] == 41 and train.attributes[attr.STEP] == 41
    assert tracer.all_devices == ["cpu0"]

    def seconds(span: Any) -> float:
        return (span.end_time - span.start_time) / 1e9

    last = {s.name: s for s in spans if s.attributes.get(attr.STEP) == 1}
    assert exported["perf/global_step_time"][0] == pytest.approx(seconds(last["rl/learner_step"]))
    assert exported["perf/sum/rollout_time"][0] == pytest.approx(seconds(last["rollout"]))
    assert exported["perf/mean/rollout_time"][0] == pytest.approx(seconds(last["rollout"]))
    assert exported["perf/weight_sync_time"][0] == pytest.approx(seconds(last["weight_sync"]))
    assert exported["perf/sum/actor_train_step_time"] == (0.0, None)
    assert "perf/mean/actor_train_step_time" not in exported  # no such span: not a NaN
    assert tracer.export() == {}  # no current run any more


def test_tracer_records_exceptions_and_reraises() -> None:
    tracer = OTelPerfTracer()
    with capture() as cap:
        with pytest.raises(ValueError, match="boom"):
            with tracer.span("rollout"):
                raise ValueError("boom")
        spans = cap.spans()
    rollout = next(s for s in spans if s.name == "rollout")
    assert rollout.status.status_code.name == "ERROR"


@pytest.mark.parametrize(
    ("event", "name", "mode", "role", "unit", "instrument"),
    [
        ("/train/loss", "loss", "train", None, "1", "tunix.training.loss"),
        ("/eval/perplexity", "perplexity", "eval", None, "1", "tunix.training.perplexity"),
        ("/train/grad_norm", "grad_norm", "train", None, "1", "tunix.training.gradient.norm"),
        ("actor/train/kl", "kl", "train", "actor", "1", "tunix.kl"),
        ("global/train/kl", "kl", "train", None, "1", "tunix.kl"),
        ("rewards/train/mean", "rewards/mean", "train", None, "1", "tunix.rewards.mean"),
        ("advantages/train/mean", "advantages/mean", "train", None, "1", "tunix.advantages.mean"),
        ("completions/train/mean_length", "completions/mean_length", "train", None, "{token}",
         "tunix.completions.mean_length"),
        ("perf/train/global_step_time", "perf/global_step_time", "train", None, "s",
         "tunix.perf.global_step_time"),
        ("actor/train/actor_dequeue_time", "actor_dequeue_time", "train", "actor", "s",
         "tunix.actor_dequeue_time"),
        ("my_metric", "my_metric", None, None, "1", "tunix.my_metric"),
        # normalised as Tunix's own OpenTelemetry path names it (lowercase, runs of other
        # characters one "."): an SFT metric has one name on both
        ("/train/rewards/score mean", "rewards/score mean", "train", None, "1",
         "tunix.rewards.score.mean"),
        ("/train/Accuracy@1", "Accuracy@1", "train", None, "1", "tunix.accuracy.1"),
    ],
)  # fmt: skip
def test_parse_event(
    event: str, name: str, mode: str | None, role: str | None, unit: str, instrument: str
) -> None:
    m = parse_event(event)
    assert (m.name, m.mode, m.role, m.unit, m.instrument_name) == (
        name, mode, role, unit, instrument,
    )  # fmt: skip


def test_backend_publishes_once_and_ignores_jax_events() -> None:
    with capture() as cap:
        first, second = OTelLoggingBackend(), OTelLoggingBackend()
        jax.monitoring.register_scalar_listener(first.log_scalar)
        jax.monitoring.register_scalar_listener(second.log_scalar)
        try:
            for step, (reward, adv) in enumerate([(1.0, -0.5), (3.0, 0.5)]):
                jax.monitoring.record_scalar("rewards/train/mean", reward, step=step)
                jax.monitoring.record_scalar("advantages/train/mean", adv, step=step)
                jax.monitoring.record_scalar("perf/train/global_step_time", 0.25, step=step)
                jax.monitoring.record_scalar("/jax/core/compile/backend_compile_duration", 1e9)
                jax.monitoring.record_scalar("actor/train/kl", np.float32(0.1), step=step)
                jax.monitoring.record_scalar("actor/train/kl_array", np.ones(3), step=step)
        finally:
            jax.monitoring.clear_event_listeners()
            first.close()
            second.close()
        second.log_scalar("/train/loss", 1.0, step=9)  # closed: ignored
        metrics = cap.metrics()
        units = cap.metric_units()
    assert [p.value for p in metrics["tunix.rewards.mean"]] == [3.0]
    assert [p.value for p in metrics["tunix.advantages.mean"]] == [0.5]
    step_time = metrics["tunix.perf.global_step_time"]
    assert units["tunix.perf.global_step_time"] == "s"
    assert [(p.count, p.sum) for p in step_time] == [(2, 0.5)]  # counted once, not twice
    (kl,) = metrics["tunix.kl"]
    assert dict(kl.attributes) == {MODE: "train", "tunix.metrics.prefix": "actor"}
    assert kl.value == pytest.approx(0.1)
    assert "tunix.kl_array" not in metrics and "tunix.training.loss" not in metrics
    assert not any("jax" in name for name in metrics)


def _has_entry_point(group: str, name: str) -> bool:
    return any(ep.name == name for ep in entry_points(group=group))


@pytest.mark.skipif(
    not (
        _has_entry_point("opentelemetry_instrumentor", "otel_tunix_tunix")
        and _has_entry_point("opentelemetry_distro", "otel_tunix")
    ),
    reason="otel-tunix's entry points are not installed (pip install -e .)",
)
@pytest.mark.parametrize("disabled", [False, True])
def test_zero_code_unmodified_tunix_script(tmp_path: Path, disabled: bool) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        SFT_SCRIPT
        + textwrap.dedent(
            """
            trainer = make_trainer(6)
            data = batches(8)
            trainer.train(data)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "DD_", "DATADOG_"))}
    env.update(
        OTEL_TUNIX_OUTPUT_DIR=str(tmp_path / "run"),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="otel_tunix_torch,otel_tunix_transformers"
        + (",otel_tunix_tunix" if disabled else ""),
    )
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        [str(bin_dir / "opentelemetry-instrument"), sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    if disabled:  # nothing starts a training step, so nothing configures a run
        assert not (tmp_path / "run" / "spans.jsonl").exists()
        return
    records = [
        json.loads(line) for line in (tmp_path / "run" / "spans.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if r.get("type") == "step" and r["scope"] == "train"]
    assert [r["step"] for r in steps] == list(range(1, 7))  # as Tunix numbers them
    assert all("peft_train_step" in r["components"] for r in steps)
    assert "jax_compile" in steps[0]["components"]
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert '"loss"' in metrics


def test_goodput_counts_checkpoints_evaluation_and_compilation(instrumented_run: Run) -> None:
    """The live ledger of the PeftTrainer run: ``checkpoint_save`` is the time of Tunix's
    saves, ``evaluation`` of its eval steps (with their device run-on), ``compilation`` of the
    JAX integration's compile components, each as their spans measured it."""
    spans = instrumented_run.spans

    def merged(names: tuple[str, ...]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for a, b in sorted((s.start_time, s.end_time) for s in spans if s.name in names):
            if out and a <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], b))
            else:
                out.append((a, b))
        return out

    def union(names: tuple[str, ...]) -> float:
        return sum(b - a for a, b in merged(names)) / 1e9

    def overlap(x: tuple[str, ...], y: tuple[str, ...]) -> float:
        ys = merged(y)
        return sum(max(0, min(b, d) - max(a, c)) for a, b in merged(x) for c, d in ys) / 1e9

    goodput = json.loads((instrumented_run.run_dir / "summary.json").read_text())["goodput"]
    bad = goodput["badput_sec"]
    assert union(("checkpoint_save",)) > 0
    assert bad["checkpoint_save"] == pytest.approx(union(("checkpoint_save",)), abs=1e-6)
    # the eval steps, and their compute's device work past the step's end where JAX still
    # ran it (a step's own work keeps its category wherever it runs: docs/goodput.md)
    assert bad["evaluation"] == pytest.approx(union(("eval_step", "eval_step_compute")), abs=1e-6)
    # every compilation, those before the first step too (recorded outside the steps: a
    # compile component there is compilation, not initialization), less what a checkpoint
    # save or an eval step covers (they come first: Orbax's save compiles too)
    first = min(s.start_time for s in spans if s.name == "train_step")
    compile_names = ("jax_trace", "jax_lower", "jax_compile")
    assert [s for s in spans if s.name in compile_names and s.start_time >= first]
    expected = union(compile_names) - overlap(compile_names, ("checkpoint_save", "eval_step"))
    assert bad["compilation"] == pytest.approx(expected, abs=1e-6)
    assert goodput["productive_time_sec"] + sum(bad.values()) == pytest.approx(
        goodput["wall_time_sec"], rel=1e-9
    )


def test_a_restore_is_a_checkpoint_restore_component(instrumented_run: Run, tmp_path: Path) -> None:
    """``CheckpointManager.maybe_restore`` with a checkpoint to read: ``checkpoint_restore``
    (inside a step here: a component outside any step is the recording layer's part)."""
    import orbax.checkpoint as ocp

    import otel_tunix

    ckpt = instrumented_run.run_dir.parent / "ckpt"
    assert any(ckpt.iterdir())
    inst = TunixInstrumentor()
    with capture() as cap:
        inst.instrument()
        try:
            with otel_tunix.step(0, scope="setup"):
                make_trainer(
                    1,
                    checkpoint_root_directory=str(ckpt),
                    checkpointing_options=ocp.CheckpointManagerOptions(max_to_keep=1),
                )
        finally:
            inst.uninstrument()
        spans = cap.spans()
    (restore,) = [s for s in spans if s.name == "checkpoint_restore"]
    assert restore.end_time > restore.start_time
    assert _parent_name(spans, restore) == "setup_step"
