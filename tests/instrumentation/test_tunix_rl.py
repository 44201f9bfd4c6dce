"""Tunix RL on a real ``GRPOLearner``: Tunix's own ``ToyTransformer`` and ``MockVocab`` (from
``tunix.tests.test_common``), vanilla rollout, CPU, offline; 8 global steps.

Ground truths the tests measure themselves: a clock around ``train()``, Tunix's own
``PerfMetricsExport`` on the same run (through its ``perf_config``), and what Tunix logs.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import xprof_annotations

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")
optax = pytest.importorskip("optax")
nnx = pytest.importorskip("flax.nnx")
grain = pytest.importorskip("grain.python")
rl_cluster_lib = pytest.importorskip("tunix.rl.rl_cluster")
grpo_lib = pytest.importorskip("tunix.rl.grpo.grpo_learner")
base_rollout = pytest.importorskip("tunix.rl.rollout.base_rollout")
tc = pytest.importorskip("tunix.tests.test_common")

from otel_tunix.accounting import rl_steps  # noqa: E402
from otel_tunix.instrumentation.tunix import (  # noqa: E402
    PROFILER_STEP,
    OTelPerfTracer,
    TeeTracer,
    TunixInstrumentor,
)
from otel_tunix.settings import attributes as attr  # noqa: E402
from otel_tunix.testing import capture  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 8
PROMPTS = ["input string", "hello world", "My name", "hello there"]  # MockVocab's words
LEARNER_WORK = ("data_loading", "rollout", "reference_inference", "advantage_computation")


class _Prompts(grain.RandomAccessDataSource):  # type: ignore[misc]
    def __init__(self, repeat: int) -> None:
        self._data = PROMPTS * repeat

    def __getitem__(self, i: int) -> str:
        return self._data[i]

    def __len__(self) -> int:
        return len(self._data)


def _reward(completions: list[str], **_: Any) -> Any:
    return jnp.arange(len(completions)).astype(jnp.float32)


def _cluster_config(max_steps: int, *, critic: bool = False) -> Any:
    """Every role on one CPU device, vanilla rollout; a critic's optimizer when asked."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    roles = rl_cluster_lib.Role
    role_to_mesh = {roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh}
    if critic:
        role_to_mesh[roles.CRITIC] = mesh
    return rl_cluster_lib.ClusterConfig(
        role_to_mesh=role_to_mesh,
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.sgd(1e-3),
            critic_optimizer=optax.sgd(1e-3) if critic else None,
            eval_every_n_steps=100,
            max_steps=max_steps,
        ),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=10, max_prompt_length=256, kv_cache_size=1024
        ),
    )


def _prompts() -> Any:
    """MockVocab's prompts, two to a batch, each its own answer."""
    return grain.MapDataset.source(_Prompts(10)).batch(2).map(lambda x: {"prompts": x, "answer": x})


@dataclass
class RLRun:
    summaries: list[Any]
    spans: list[Any]
    wall_sec: float
    logged: list[Any]  # Tunix's MetricsBuffers, as its external metrics logger gets them
    exports: list[tuple[dict[str, Any], dict[str, Any]]]  # (Tunix's, otel-tunix's) per step
    run_dir: Path
    main_thread: int
    # How late a thread woke from a 1 ms sleep, sampled through the run: the scheduling
    # delay a waiter thread suffered at that time on this machine.
    wake_lateness: list[float]
    # (name, step_num) of each XProf step annotation Tunix made during the run
    annotations: list[tuple[str, Any]]


def _grpo_run(tmp: Path, tunix_perf: bool) -> RLRun:
    from tunix.perf import export as perf_export
    from tunix.perf import metrics as perf_metrics

    tracer = OTelPerfTracer()
    inst = TunixInstrumentor()
    run_dir = tmp / "run"
    with capture(output_dir=run_dir) as cap:
        inst.instrument(tracer=tracer)
        try:
            vocab = tc.MockVocab()
            config = tc.ModelConfig(vocab_size=vocab.GetPieceSize())
            model = tc.ToyTransformer(config=config, rngs=nnx.Rngs(0))
            reference = tc.ToyTransformer(config=config, rngs=nnx.Rngs(0))
            cluster_config = _cluster_config(STEPS)
            perf_config = None
            if tunix_perf:
                perf_config = perf_metrics.PerfMetricsConfig()
                perf_config.custom_export_fn = perf_export.PerfMetricsExport.from_cluster_config(
                    cluster_config
                )
            cluster = rl_cluster_lib.RLCluster(
                actor=model,
                reference=reference,
                tokenizer=vocab,
                cluster_config=cluster_config,
                perf_config=perf_config,
            )
            logged: list[Any] = []
            cluster.with_external_metrics_logger(logged.append)
            exports: list[tuple[dict[str, Any], dict[str, Any]]] = []
            if tunix_perf:
                tee = cluster.perf
                assert isinstance(tee, TeeTracer)
                tunix_export = tee.theirs.export

                def both() -> dict[str, Any]:  # observe both exports at the same moment
                    theirs = tunix_export()
                    exports.append((theirs, tracer.export()))
                    return theirs

                tee.theirs.export = both
            learner = grpo_lib.GRPOLearner(
                rl_cluster=cluster,
                reward_fns=_reward,
                algo_config=grpo_lib.GRPOConfig(num_generations=2, num_iterations=1),
            )
            lateness: list[float] = []
            done = threading.Event()

            def probe() -> None:
                while not done.is_set():
                    t0 = time.perf_counter()
                    time.sleep(0.001)
                    lateness.append(time.perf_counter() - t0 - 0.001)

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            start = time.perf_counter()
            try:
                with xprof_annotations() as annotations:
                    learner.train(_prompts())
            finally:
                done.set()
                prober.join()
            wall = time.perf_counter() - start
        finally:
            inst.uninstrument()
        cap.flush()
        spans = cap.spans()
        summaries = list(cap.summaries)
    main = threading.main_thread().ident or 0
    return RLRun(summaries, spans, wall, logged, exports, run_dir, main, lateness, annotations)


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory) -> RLRun:
    return _grpo_run(tmp_path_factory.mktemp("grpo"), tunix_perf=False)


@pytest.fixture(scope="module")
def grpo_tunix_perf(tmp_path_factory: pytest.TempPathFactory) -> RLRun:
    return _grpo_run(tmp_path_factory.mktemp("grpo-perf"), tunix_perf=True)


def _by_scope(run: RLRun) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for s in run.summaries:
        out.setdefault(s.scope, []).append(s)
    return out


@pytest.mark.parametrize("with_tunix_perf", [False, True])
def test_executor_work_is_in_the_learner_step_no_stray_steps(
    request: pytest.FixtureRequest, with_tunix_perf: bool
) -> None:
    run: RLRun = request.getfixturevalue("grpo_tunix_perf" if with_tunix_perf else "grpo")
    scopes = _by_scope(run)
    assert set(scopes) == {"rl/learner", "rl/actor"}  # no stray ``train`` steps
    # rl/learner numbered by Tunix's global_steps, the actor's steps as Tunix logs them
    assert [s.step for s in scopes["rl/learner"]] == list(range(STEPS))
    assert [s.step for s in scopes["rl/actor"]] == list(range(1, STEPS + 1))
    for s in scopes["rl/learner"]:
        counts = Counter(span.name for span in s.spans)
        for name in (*LEARNER_WORK, "actor_training"):
            assert counts[name] == 1, (s.step, name)
        # Tunix ran them on its executor thread: carried into the step, not a step of its own
        rollout = next(span for span in s.spans if span.name == "rollout")
        assert rollout.thread_id != run.main_thread
        assert rollout.attributes.get(attr.DEVICE_END) is True
        assert s.busy_time_sec + s.blocked_time_sec + s.idle_time_sec == pytest.approx(
            s.step_time_sec
        )
    for s in scopes["rl/actor"]:
        assert Counter(span.name for span in s.spans)["peft_train_step"] == 1


def test_one_name_per_kind_of_work_and_tunix_tags_as_attributes(grpo: RLRun) -> None:
    names = {s.name for s in grpo.spans}
    assert "refer_inference" not in names and "peft_train" not in names
    assert {"reference_inference", "peft_train_step"} <= names
    for span in grpo.spans:
        if span.name in ("rollout", "reference_inference", "advantage_computation"):
            # Tunix's step tag is its global step: the learner step's own number here
            assert span.attributes["tunix.global_step"] == span.attributes[attr.STEP]
        if span.name == "rollout":
            assert span.attributes["tunix.role"] == "rollout"
        if span.name == "peft_train_step":
            assert span.attributes["tunix.role"] == "actor"
            assert span.attributes["tunix.micro_batch"] == 0


def test_learner_steps_carry_the_step_number_of_tunix_xprof_annotations(grpo: RLRun) -> None:
    """Tunix's ``trainer`` annotation of a global step numbers it by the learner's iteration
    count as it starts: that number is on the learner step span, beside Tunix's global step."""
    learner = [s for s in grpo.spans if s.name == "rl/learner_step"]
    trainer = [n for name, n in grpo.annotations if name == "trainer"]
    assert len(trainer) == len(learner) == STEPS
    assert sorted(s.attributes[PROFILER_STEP] for s in learner) == sorted(trainer)


def test_learner_steps_tile_the_training_loop(grpo: RLRun) -> None:
    learner = [s for s in grpo.summaries if s.scope == "rl/learner"]
    total = sum(s.step_time_sec for s in learner)
    # outside the steps: the first batch fetch, and Tunix's metric buffering between steps
    assert 0.9 * grpo.wall_sec <= total <= grpo.wall_sec


def test_tunix_perf_metrics_come_from_our_spans_and_join_their_step(grpo: RLRun) -> None:
    learner = {s.step: s for s in grpo.summaries if s.scope == "rl/learner"}
    # Tunix buffers export() after counting the global step: step k's arrive at k + 1
    perf = {
        b.global_steps - 1: b.metrics for b in grpo.logged if "perf/global_step_time" in b.metrics
    }
    assert sorted(perf) == list(range(STEPS))
    for k, metrics in perf.items():
        step = learner[k]
        assert metrics["perf/global_step_time"][0] == [pytest.approx(step.step_time_sec)]
        rollout = next(s for s in step.spans if s.name == "rollout")
        assert metrics["perf/sum/rollout_time"][0] == [
            pytest.approx((rollout.end_ns - rollout.start_ns) / 1e9)
        ]
    # metrics.jsonl: Tunix's RL metrics and otel-tunix's at the learner step's number
    rows = [
        json.loads(line) for line in (grpo.run_dir / "metrics.jsonl").read_text().splitlines()[1:]
    ]
    at: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r.get("step") is not None:
            at.setdefault(r["step"], {}).update(r["metrics"])
    for k, step in learner.items():
        assert at[k]["perf/global_step_time"] == pytest.approx(step.step_time_sec)
        assert at[k]["perf/rl/learner/step_time_sec"] == pytest.approx(step.step_time_sec)
        assert "rewards/mean" in at[k]
        # the learner step added up (docs/rl.md): Tunix logs its perf/* names itself, so
        # otel-tunix's breakdown has names of its own, and its parts sum to the step
        assert at[k]["rl/step/step_time"] == pytest.approx(step.step_time_sec)
        parts = [at[k][f"rl/step/{part}_time"] for part in rl_steps.PARTS]
        assert sum(parts) == pytest.approx(step.step_time_sec, rel=0.01)
        assert at[k]["rl/step/rollout_time"] > 0 and at[k]["rl/step/training_time"] > 0


def test_parity_with_tunix_perf_metrics_export(grpo_tunix_perf: RLRun) -> None:
    exports = grpo_tunix_perf.exports
    assert len(exports) == STEPS
    diffs: dict[str, list[float]] = {}
    for theirs, ours in exports:
        assert set(ours) == set(theirs)
        for key, (value, _) in theirs.items():
            diffs.setdefault(key, []).append(ours[key][0] - float(value))
    # The two tracers read their own clocks at the same boundaries; a device end is read by
    # each tracer's waiter thread when it wakes and gets the GIL, so each difference is a
    # scheduling race: ~0.1 ms on a quiet machine, ~15 ms on a loaded one. A boundary
    # placed elsewhere moves every step's difference the same way: the median then stands
    # out of the differences' own spread (measured in this run), which noise alone does not.
    late = np.array(grpo_tunix_perf.wake_lateness)
    assert len(late) > 10
    worst = float(late.max())  # the longest a thread waited to wake, in this run
    print(f"wake lateness: max {worst * 1e3:.2f} ms")
    for key, d in sorted(diffs.items()):
        print(f"{key}: median {np.median(d) * 1e3:+.2f} ms, max |{np.max(np.abs(d)) * 1e3:.2f}| ms")
    for key, d in diffs.items():
        med = float(np.median(d))
        spread = float(np.max(np.abs(np.asarray(d) - med)))
        assert abs(med) < 1e-3 + spread, (key, med, spread)
    # Every step: the two readings of one boundary differ by at most a few thread switches
    # (Python's switch interval is 5 ms) plus, for each end of a duration, how late a
    # waiter woke (at most ``worst``, measured). The span counts per step are asserted above.
    for theirs, ours in exports:
        for key, (value, _) in theirs.items():
            limit = max(0.015, 0.25 * float(value)) + 2 * worst
            assert abs(ours[key][0] - float(value)) <= limit, (key, worst)


def test_ppo_learner_actor_and_critic_steps_inside_the_learner_step(tmp_path: Path) -> None:
    ppo_lib = pytest.importorskip("tunix.rl.ppo.ppo_learner")
    inst = TunixInstrumentor()
    with capture() as cap:
        inst.instrument()
        try:
            vocab = tc.MockVocab()
            config = tc.ModelConfig(vocab_size=vocab.GetPieceSize())
            critic = tc.ToyTransformerWithScoreHead(
                tc.ToyTransformer(config=config, rngs=nnx.Rngs(1)), nnx.Rngs(1)
            )
            cluster = rl_cluster_lib.RLCluster(
                actor=tc.ToyTransformer(config=config, rngs=nnx.Rngs(0)),
                critic=critic,
                reference=tc.ToyTransformer(config=config, rngs=nnx.Rngs(0)),
                tokenizer=vocab,
                cluster_config=_cluster_config(4, critic=True),
            )
            # its config argument is ``ppo_config`` in google-tunix 0.1.7, ``algo_config`` on
            # Tunix HEAD (which takes ``rl_cluster`` for its ``rl_engine`` still)
            params = inspect.signature(ppo_lib.PPOLearner.__init__).parameters
            config = "algo_config" if "algo_config" in params else "ppo_config"
            learner = ppo_lib.PPOLearner(
                rl_cluster=cluster,
                reward_fns=_reward,
                **{config: ppo_lib.PPOConfig(num_iterations=1)},
            )
            start = time.perf_counter()
            learner.train(_prompts())
            wall = time.perf_counter() - start
        finally:
            inst.uninstrument()
        cap.flush()
        summaries = list(cap.summaries)
    scopes = Counter(s.scope for s in summaries)
    assert scopes == {"rl/learner": 4, "rl/actor": 4, "rl/critic": 4}  # no stray steps
    learner_steps = [s for s in summaries if s.scope == "rl/learner"]
    for s in learner_steps:
        counts = Counter(span.name for span in s.spans)
        for name in ("data_loading", "rollout", "actor_training", "critic_training"):
            assert counts[name] == 1, (s.step, name)
    assert 0.9 * wall <= sum(s.step_time_sec for s in learner_steps) <= wall
