"""What only upstream Tunix HEAD has (``../shared/vendor/``, see ``test_tunix_versions.py``,
which runs this module on it): its own OpenTelemetry path beside otel-tunix's, and its
orchestrator. On google-tunix 0.1.7 every test here skips."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")
optax = pytest.importorskip("optax")
nnx = pytest.importorskip("flax.nnx")
peft_trainer = pytest.importorskip("tunix.sft.peft_trainer")
tunix_metrics_logger = pytest.importorskip("tunix.sft.metrics_logger")

import otel_tunix  # noqa: E402
from otel_tunix.instrumentation.tunix import TunixInstrumentor  # noqa: E402

pytestmark = pytest.mark.slow

OUR_SCOPES = {"otel_tunix", "otel_tunix.instrumentation.tunix"}

needs_upstream_otel = pytest.mark.skipif(
    "enable_opentelemetry"
    not in {f.name for f in dataclasses.fields(tunix_metrics_logger.MetricsLoggerOptions)},
    reason="this Tunix has no OpenTelemetry path of its own (google-tunix 0.1.7)",
)


class _MLP(nnx.Module):  # type: ignore[misc]
    def __init__(self, rngs: Any) -> None:
        self.l1 = nnx.Linear(8, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.l2(nnx.relu(self.l1(x)))


def _loss(model: Any, x: Any, y: Any) -> Any:
    return jnp.mean((model(x) - y) ** 2)


def _batches(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [
        {
            "x": rng.normal(size=(4, 8)).astype(np.float32),
            "y": rng.normal(size=(4, 1)).astype(np.float32),
        }
        for _ in range(n)
    ]


@needs_upstream_otel
def test_upstream_otel_path_and_ours_give_each_value_once_at_the_collector(
    rotel_collector: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Tunix's ``enable_opentelemetry`` on, and otel-tunix instrumenting the same run: each
    value reaches a real collector once, under one name, from one scope, with one unit."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rotel_collector.grpc_endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    otel_tunix.configure(service_name="both", output_dir=tmp_path / "run", console_interval=0)
    inst = TunixInstrumentor()
    inst.instrument()
    try:
        options = tunix_metrics_logger.MetricsLoggerOptions(
            log_dir=str(tmp_path / "tb"), enable_opentelemetry=True
        )
        cfg = peft_trainer.TrainingConfig(
            eval_every_n_steps=100, max_steps=4, metrics_logging_options=options
        )
        opt = optax.inject_hyperparams(optax.sgd)(learning_rate=1e-2)
        trainer = peft_trainer.PeftTrainer(_MLP(nnx.Rngs(0)), opt, cfg).with_loss_fn(_loss)
        # names from the issue: an RL cluster's prefixes, a step time, an SFT name with a
        # space (logged before train(), which closes the logger's backends at its end)
        log = trainer.metrics_logger.log
        log("rewards", "mean", 1.5, "train", 0)
        log("perf", "global_step_time", 0.25, "train", 0)
        log("", "rewards/score mean", 0.5, "train", 0)
        trainer.train(_batches(6))
    finally:
        otel_tunix.shutdown()
        inst.uninstrument()

    ours = {
        "tunix.training.loss",
        "tunix.rewards.mean",
        "tunix.perf.global_step_time",
        "tunix.rewards.score.mean",
        "tunix.steps",
    }
    out = rotel_collector.wait_for_metrics(*ours, "tunix.training.step")
    scopes: dict[str, set[str]] = defaultdict(set)
    units: dict[str, set[str]] = defaultdict(set)
    for m in out.metrics:
        scopes[m.name].add(m.scope_name)
        units[m.name].add(m.unit)
    assert all(len(s) == 1 for s in scopes.values()), dict(scopes)  # one writer per name
    assert all(len(u) == 1 for u in units.values()), dict(units)  # one unit per name
    # Tunix's meter keeps the one value otel-tunix does not publish: its logical step
    assert {n for n, s in scopes.items() if s == {"tunix"}} == {"tunix.training.step"}
    others = set().union(*scopes.values()) - {"tunix"}
    assert OUR_SCOPES <= others and all(s.startswith("otel_tunix") for s in others), others
    assert scopes["tunix.training.loss"] == {"otel_tunix.instrumentation.tunix"}
    assert scopes["tunix.steps"] == {"otel_tunix"}  # otel-tunix's own scope is not "tunix"
    # upstream's names for the same values do not arrive a second time
    for upstream in ("tunix.mean", "tunix.global_step_time", "tunix.score.mean"):
        assert upstream not in scopes
    assert units["tunix.perf.global_step_time"] == {"s"}
    kinds = {m.data_type for m in out.metrics if m.name == "tunix.perf.global_step_time"}
    assert kinds == {"Histogram"}
    assert units["tunix.training.loss"] == {"1"}
    losses = [p.value for m in out.metrics if m.name == "tunix.training.loss" for p in m.points]
    last = float(trainer.metrics_logger.get_metric_history("", "loss", "train")[-1])
    assert losses and losses[-1] == pytest.approx(last)
