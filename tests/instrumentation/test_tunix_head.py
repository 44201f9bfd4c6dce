"""What only upstream Tunix HEAD has (``../shared/vendor/``, see ``test_tunix_versions.py``,
which runs this module on it): its own OpenTelemetry path beside otel-tunix's, and its
orchestrator. On google-tunix 0.1.7 every test here skips."""

from __future__ import annotations

import dataclasses
import time
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
from otel_tunix.settings import attributes as attr  # noqa: E402
from otel_tunix.testing import capture  # noqa: E402

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


# --- the orchestrator (tunix.experimental.orchestrator) ----------------------------------


class _Payload:
    """What the tiny algorithm makes of a group: the policy version its rollouts had."""

    def __init__(self, version: int) -> None:
        self.advantages = 0.0
        self.version = version


class _Algo:
    group_size = 2
    mini_batch_size = 1

    def create_trainer_payloads(self, group: Any, rewards: Any) -> list[_Payload]:
        return [_Payload(min(item.policy_version for item in group)) for _ in group]


class _Assembler:
    def pack(self, payloads: list[_Payload]) -> list[list[_Payload]]:
        return [payloads]


class _Engine:
    """Rollouts made at once with the version they are dispatched with; training records
    the rollout versions it trains on (the test's own bookkeeping)."""

    def __init__(self, datatypes: Any) -> None:
        self._dt = datatypes
        self._pending: list[Any] = []
        self.trained: list[int] = []

    async def dispatch_rollouts(
        self, prompts: Any, *, group_size: int = 1, policy_version: int = 0, **_: Any
    ) -> list[str]:
        for prompt in prompts:
            for g in range(group_size):
                self._pending.append(
                    self._dt.TrajectoryItem(
                        pair_index=g,
                        group_id=prompt["prompt_id"],
                        start_step=0,
                        traj=self._dt.Trajectory(reward=1.0),
                        policy_version=policy_version,
                    )
                )
        return [p["prompt_id"] for p in prompts]

    async def poll_rollouts(self, timeout_s: float = 0.0) -> list[Any]:
        import asyncio

        await asyncio.sleep(0.001)
        done, self._pending = self._pending, []
        return done

    async def train_step(self, batch: list[_Payload], **_: Any) -> dict[str, float]:
        self.trained.extend(p.version for p in batch)
        return {"loss": 0.1}

    async def sync_weights(self, role: Any = None) -> None:
        return None


def test_orchestrator_steps_carry_policy_version_and_lag() -> None:
    rl_program = pytest.importorskip("tunix.experimental.orchestrator.rl_program")
    datatypes = pytest.importorskip("tunix.experimental.common.datatypes")
    engine = _Engine(datatypes)
    begun: list[int] = []  # the user's own callback, still called
    truth: dict[int, int] = {}  # step -> learner version minus the oldest rollout's

    def on_begin(step: int) -> None:
        begun.append(step)
        engine.trained = []

    def on_end(step: int, result: Any) -> None:
        truth[begun[-1]] = begun[-1] - min(engine.trained)

    inst = TunixInstrumentor()
    with capture() as cap:
        inst.instrument()
        try:
            program = rl_program.StandardRLProgram(
                _Algo(),
                dataset=[{"prompt": f"p{i}"} for i in range(8)],
                assembler=_Assembler(),
                max_staleness=2,
                on_step_begin=on_begin,
                on_step_end=on_end,
            )
            program.run(engine, num_steps=4)
        finally:
            inst.uninstrument()
        cap.flush()
        spans = cap.spans()
        metrics = cap.metrics()
    assert begun == [0, 1, 2, 3]
    steps = sorted(
        (s for s in spans if s.name == "rl/learner_step"), key=lambda s: s.attributes[attr.STEP]
    )
    assert [s.attributes[attr.STEP] for s in steps] == begun
    for s in steps:
        n = s.attributes[attr.STEP]
        assert s.attributes["tunix.rl.policy_version"] == n
        assert s.attributes["tunix.rl.policy_lag"] == truth[n]
    assert max(truth.values()) > 0  # rollouts made ahead of the learner: a real lag
    assert [p.value for p in metrics["tunix.rl.policy_lag.max"]] == [truth[3]]  # a gauge: the last
    assert [p.value for p in metrics["tunix.rl.policy_version"]] == [3]


class _Worker:
    def __init__(self, worker_id: str, datatypes: Any) -> None:
        self._dt = datatypes
        self.worker_id = worker_id
        self.state = datatypes.WorkerState.COMPILING

    def info(self) -> Any:
        return self._dt.WorkerInfo(
            worker_id=self.worker_id, roles=frozenset([self._dt.Role.ROLLOUT])
        )

    def heartbeat(self) -> Any:
        return self._dt.HealthReport(state=self.state)


def test_time_per_worker_state_is_a_component() -> None:
    health_monitor = pytest.importorskip("tunix.experimental.orchestrator.health_monitor")
    worker_registry = pytest.importorskip("tunix.experimental.orchestrator.worker_registry")
    datatypes = pytest.importorskip("tunix.experimental.common.datatypes")
    State = datatypes.WorkerState
    registry = worker_registry.WorkerRegistry()
    workers = [_Worker("rollout_0", datatypes), _Worker("rollout_1", datatypes)]
    for w in workers:
        registry.register(w)

    polls: list[tuple[int, int]] = []  # our own clock around each poll

    def poll(monitor: Any) -> None:
        before = time.perf_counter_ns()
        monitor.poll()
        polls.append((before, time.perf_counter_ns()))

    inst = TunixInstrumentor()
    with capture() as cap:
        inst.instrument()
        try:
            monitor = health_monitor.HealthMonitor(registry)
            with otel_tunix.step(1, scope="rl/learner"):
                poll(monitor)  # both COMPILING
                workers[0].state = State.READY
                poll(monitor)  # rollout_0: COMPILING ended
                workers[1].state = State.SYNCING
                poll(monitor)  # rollout_1: COMPILING ended
                workers[1].state = State.READY
                poll(monitor)  # rollout_1: SYNCING ended
            before = time.perf_counter_ns()
            monitor.close()  # both READY end
            polls.append((before, time.perf_counter_ns()))
        finally:
            inst.uninstrument()
        cap.flush()
        spans = cap.spans()

    def window(name: str, wid: str) -> tuple[int, int]:
        (span,) = [
            s for s in spans if s.name == name and s.attributes.get("tunix.worker.id") == wid
        ]
        assert span.attributes["tunix.worker.state"] == name.removeprefix("worker_").upper()
        return span.start_time, span.end_time

    def from_poll_to_poll(name: str, wid: str, first: int, last: int) -> None:
        """The state's time runs from the poll that saw it begin to the one that saw it end:
        its length lies within what the test's clock measured around those two polls."""
        start, end = window(name, wid)
        shortest = polls[last][0] - polls[first][1]
        longest = polls[last][1] - polls[first][0]
        assert shortest <= end - start <= longest, (name, wid)

    from_poll_to_poll("worker_compiling", "rollout_0", 0, 1)
    from_poll_to_poll("worker_compiling", "rollout_1", 0, 2)
    from_poll_to_poll("worker_syncing", "rollout_1", 2, 3)
    from_poll_to_poll("worker_ready", "rollout_0", 1, 4)  # ended by close()
    from_poll_to_poll("worker_ready", "rollout_1", 3, 4)
    # one state ends where the worker's next begins
    assert window("worker_compiling", "rollout_1")[1] == window("worker_syncing", "rollout_1")[0]
    syncing = next(s for s in spans if s.name == "worker_syncing")
    assert syncing.attributes[attr.STEP] == 1  # in the step open where the monitor polls
