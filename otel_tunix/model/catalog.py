"""The metric catalog: one table of every metric otel-tunix knows, with its name on each side.

Each :class:`MetricSpec` row ties together

* the **MetricsLogger name** in the seeds' slash style (``loss``, ``rewards/mean``,
  ``pg_clipfrac``) that trainers log and that TensorBoard, W&B and the JSONL file show, and
* the **OTel instrument**: a dotted name with a real unit, the instrument kind, constant
  attributes and, for histograms, bucket boundaries in the unit.

Rows whose instrument is defined by the OpenTelemetry semantic conventions (``hw.gpu.*``,
``gen_ai.*``, ``process.*``, ``system.*``) say so (``semconv=True``) and use the
convention's name, kind and unit. Everything else lives under ``tunix.*``: the training
metrics that upstream Tunix's MetricsLogger emits to OTel itself keep Tunix's names and its
attribute ``tunix.training.mode`` (``loss`` and ``eval/loss`` are one instrument,
``tunix.training.loss``, in two modes), and the other training rows share that namespace.
Variable parts of a logger name (``rewards/<reward_fn>``) become attributes, never part of
an instrument name, so no two metrics collapse into one and cardinality stays in attributes.

``docs/metrics.md`` renders this table; :func:`lookup` finds the row of a logged name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from otel_tunix.model.metric_spec import (
    E2E_LATENCY_BUCKETS,
    INTER_TOKEN_LATENCY_BUCKETS,
    MODE_ATTRIBUTE,
    POLICY_LAG_BUCKETS,
    SECONDS_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
    TOKEN_COUNT_BUCKETS,
    WEIGHT_BYTES_BUCKETS,
    Instrument,
    MetricSpec,
)

__all__ = [
    "CATALOG",
    "Match",
    "by_otel_name",
    "guess_unit",
    "lookup",
    "markdown_table",
    "rows",
]


G, C, U, H = (
    Instrument.GAUGE,
    Instrument.COUNTER,
    Instrument.UP_DOWN_COUNTER,
    Instrument.HISTOGRAM,
)


def _stats(
    group: str,
    logger_prefix: str,
    otel_prefix: str,
    what: str,
    stats: tuple[str, ...] = ("mean", "std", "max", "min"),
    unit: str = "1",
) -> list[MetricSpec]:
    words = {
        "mean": "Mean",
        "std": "Standard deviation",
        "max": "Maximum",
        "min": "Minimum",
        "sum": "Sum",
    }
    return [
        MetricSpec(
            f"{otel_prefix}.{s}",
            G,
            unit,
            f"{words[s]} of {what} over the batch",
            group,
            f"{logger_prefix}/{s}",
        )
        for s in stats
    ]


_TRAIN: Final = MappingProxyType({MODE_ATTRIBUTE: "train"})
_EVAL: Final = MappingProxyType({MODE_ATTRIBUTE: "eval"})
_VERSION = "Policy (weights) version the learner trains; one more per weight sync"
_LOSS = "Loss of the training step (mode train) or of an evaluation (mode eval)"

_ROWS: list[MetricSpec] = [
    # --- training: the four names Tunix's own MetricsLogger gives its OTel gauges, with its
    # attribute tunix.training.mode (train / eval) ---------------------------------------
    MetricSpec("tunix.training.loss", G, "1", _LOSS, "training", "loss", attributes=_TRAIN),
    MetricSpec("tunix.training.loss", G, "1", _LOSS, "training", "eval/loss", attributes=_EVAL),
    MetricSpec(
        "tunix.training.perplexity",
        G,
        "1",
        "exp(loss), overflow-safe (inf when loss > ~709)",
        "training",
        "perplexity",
        attributes=_TRAIN,
    ),
    MetricSpec(
        "tunix.training.perplexity",
        G,
        "1",
        "exp(loss), overflow-safe (inf when loss > ~709)",
        "training",
        "eval/perplexity",
        attributes=_EVAL,
    ),
    MetricSpec(
        "tunix.training.learning_rate",
        G,
        "1",
        "Learning rate of the step",
        "training",
        "learning_rate",
        attributes=_TRAIN,
    ),
    MetricSpec(
        "tunix.training.gradient.norm",
        G,
        "1",
        "Global L2 norm of the gradients",
        "training",
        "grad_norm",
        attributes=_TRAIN,
    ),
    # --- training: the rest, in the same namespace -------------------------------------
    MetricSpec(
        "tunix.training.step_time",
        G,
        "s",
        "Step wall time as the trainer measured it (the span-derived histogram is "
        "tunix.step.duration)",
        "training",
        "step_time_sec",
    ),
    MetricSpec(
        "tunix.training.steps_per_second",
        G,
        "{step}/s",
        "Training steps per second",
        "training",
        "steps_per_sec",
    ),
    MetricSpec(
        "tunix.training.samples_per_second",
        G,
        "{sample}/s",
        "Training samples (sequences) per second, all devices",
        "training",
        "samples_per_sec",
    ),
    MetricSpec(
        "tunix.training.tokens_per_second",
        G,
        "{token}/s",
        "Training tokens per second, all devices",
        "training",
        "tokens_per_sec",
    ),
    MetricSpec(
        "tunix.training.flops_per_step",
        G,
        "{flop}",
        "Model FLOPs of one step, all devices (logged in TFLOP)",
        "training",
        "tflops_per_step",
        scale=1e12,
    ),
    MetricSpec(
        "tunix.training.flops_per_second",
        G,
        "{flop}/s",
        "Achieved model FLOP/s per device (logged in TFLOP/s)",
        "training",
        "tflops_per_sec",
        scale=1e12,
    ),
    MetricSpec(
        "tunix.training.mfu",
        G,
        "1",
        "Model FLOPs utilization: achieved FLOP/s per device / the device's dense peak for "
        "the dtype (0..1)",
        "training",
        "mfu",
    ),
    # --- RL -----------------------------------------------------------------------------
    *_stats(
        "rl",
        "rewards",
        "tunix.rl.reward",
        "the sequence rewards",
        ("sum", "mean", "std", "max", "min"),
    ),
    MetricSpec(
        "tunix.rl.reward.function",
        G,
        "1",
        "Mean reward of one reward function",
        "rl",
        "rewards/{reward_fn}",
    ),
    *_stats(
        "rl",
        "score",
        "tunix.rl.score",
        "the raw reward-model scores (before KL)",
        ("mean", "max", "min"),
    ),
    MetricSpec(
        "tunix.rl.reward.kl_penalty",
        G,
        "1",
        "Mean KL penalty subtracted from the rewards",
        "rl",
        "reward_kl_penalty",
    ),
    *_stats("rl", "advantages", "tunix.rl.advantage", "the advantages (masked tokens only)"),
    *_stats("rl", "returns", "tunix.rl.return", "the returns (masked tokens only)"),
    *_stats("rl", "values", "tunix.rl.critic.value", "the value estimates (masked tokens only)"),
    MetricSpec(
        "tunix.rl.policy.clip_fraction",
        G,
        "1",
        "Fraction of tokens whose policy ratio was clipped",
        "rl",
        "pg_clipfrac",
    ),
    MetricSpec(
        "tunix.rl.critic.clip_fraction",
        G,
        "1",
        "Fraction of tokens whose value update was clipped",
        "rl",
        "vf_clipfrac",
    ),
    MetricSpec("tunix.rl.policy.entropy", G, "1", "Mean policy entropy", "rl", "loss/entropy"),
    MetricSpec("tunix.rl.policy_version", G, "{version}", _VERSION, "rl", "policy_version"),
    MetricSpec("tunix.rl.policy.loss", G, "1", "Policy-gradient loss", "rl", "policy_loss"),
    MetricSpec("tunix.rl.critic.loss", G, "1", "Value-function loss", "rl", "value_loss"),
    MetricSpec(
        "tunix.rl.policy.kl",
        G,
        "1",
        "KL divergence of the policy from the reference",
        "rl",
        "kl",
    ),
    MetricSpec(
        "tunix.rl.critic.explained_variance",
        G,
        "1",
        "1 - Var(returns - values) / Var(returns)",
        "rl",
        "explained_variance",
    ),
    MetricSpec(
        "tunix.rl.completion.length.mean",
        G,
        "{token}",
        "Mean completion length",
        "rl",
        "completions/mean_length",
    ),
    MetricSpec(
        "tunix.rl.completion.length.max",
        G,
        "{token}",
        "Longest completion",
        "rl",
        "completions/max_length",
    ),
    MetricSpec(
        "tunix.rl.completion.length.min",
        G,
        "{token}",
        "Shortest completion",
        "rl",
        "completions/min_length",
    ),
    MetricSpec(
        "tunix.rl.completion.clipped_ratio",
        G,
        "1",
        "Fraction of completions that hit the length limit",
        "rl",
        "completions/clipped_ratio",
    ),
    MetricSpec(
        "tunix.rl.actor.dequeue_time",
        H,
        "s",
        "Time the actor waited for rollouts from its queue",
        "rl",
        "actor_dequeue_time",
        buckets=SECONDS_BUCKETS,
    ),
    MetricSpec(
        "tunix.rl.policy_lag",
        H,
        "{step}",
        "Policy versions between the rollout a learner step trained on and the learner "
        "(one value per rollout consumed; otel_tunix.rl.consume)",
        "rl",
        buckets=POLICY_LAG_BUCKETS,
    ),
    MetricSpec(
        "tunix.rl.policy_lag.max",
        G,
        "{step}",
        "Largest policy lag among the rollouts one learner step consumed",
        "rl",
        "policy_lag",
    ),
    MetricSpec(
        "tunix.rl.weight_sync.count",
        C,
        "{sync}",
        "Weight syncs: the learner publishing its weights to the actors (rl.weight_sync)",
        "rl",
    ),
    MetricSpec(
        "tunix.rl.weight_sync.duration",
        H,
        "s",
        "Time of one weight sync",
        "rl",
        buckets=SECONDS_BUCKETS,
    ),
    MetricSpec(
        "tunix.rl.weight_sync.bytes",
        H,
        "By",
        "Bytes one weight sync moved (as the caller gave them)",
        "rl",
        buckets=WEIGHT_BYTES_BUCKETS,
    ),
    MetricSpec(
        "tunix.rl.weight_sync.per_step",
        G,
        "{sync}",
        "Weight syncs in one learner step so far (more than one: the weight_sync_repeated alert)",
        "rl",
        "rl/weight_syncs_per_step",
    ),
    # --- generation ---------------------------------------------------------------------
    MetricSpec(
        "gen_ai.server.time_to_first_token",
        H,
        "s",
        "Time from request start to its first output token",
        "generation",
        buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
        semconv=True,
    ),
    MetricSpec(
        "gen_ai.server.time_per_output_token",
        H,
        "s",
        "Decode time per output token after the first",
        "generation",
        buckets=INTER_TOKEN_LATENCY_BUCKETS,
        semconv=True,
    ),
    MetricSpec(
        "gen_ai.server.request.duration",
        H,
        "s",
        "End-to-end time of a request (start to its last token)",
        "generation",
        buckets=E2E_LATENCY_BUCKETS,
        semconv=True,
    ),
    MetricSpec(
        "gen_ai.client.token.usage",
        H,
        "{token}",
        "Tokens per request; gen_ai.token.type = input (prompt) or output",
        "generation",
        buckets=TOKEN_COUNT_BUCKETS,
        semconv=True,
    ),
    MetricSpec(
        "tunix.generation.requests",
        C,
        "{request}",
        "Finished requests, by finish_reason (stop, length, ...)",
        "generation",
    ),
    MetricSpec(
        "tunix.generation.requests.active",
        U,
        "{request}",
        "Requests being generated now",
        "generation",
    ),
    MetricSpec(
        "tunix.generation.prompt_tokens",
        C,
        "{token}",
        "Prompt tokens processed",
        "generation",
    ),
    MetricSpec(
        "tunix.generation.output_tokens",
        C,
        "{token}",
        "Output tokens generated",
        "generation",
    ),
    MetricSpec(
        "tunix.generation.prefill.duration",
        H,
        "s",
        "Prefill time: request start to first token",
        "generation",
        buckets=E2E_LATENCY_BUCKETS,
    ),
    MetricSpec(
        "tunix.generation.decode.duration",
        H,
        "s",
        "Decode time: first to last token of a request",
        "generation",
        buckets=E2E_LATENCY_BUCKETS,
    ),
    MetricSpec(
        "tunix.generation.tokens_per_second",
        G,
        "{token}/s",
        "Output tokens per second of the latest generate call (all its requests)",
        "generation",
    ),
    # --- GPU (NVML) ---------------------------------------------------------------------
    MetricSpec(
        "hw.gpu.utilization",
        G,
        "1",
        "Fraction of time the GPU ran a kernel",
        "gpu",
        attributes={"hw.gpu.task": "general"},
        semconv=True,
    ),
    MetricSpec("hw.gpu.memory.usage", U, "By", "GPU memory used", "gpu", semconv=True),
    MetricSpec("hw.gpu.memory.limit", U, "By", "Size of the GPU memory", "gpu", semconv=True),
    MetricSpec(
        "hw.gpu.memory.utilization",
        G,
        "1",
        "Fraction of GPU memory used",
        "gpu",
        semconv=True,
    ),
    MetricSpec("hw.power", G, "W", "Power drawn by the GPU", "gpu", semconv=True),
    MetricSpec(
        "hw.energy",
        C,
        "J",
        "Energy used by the GPU since the driver loaded",
        "gpu",
        semconv=True,
    ),
    MetricSpec("hw.temperature", G, "Cel", "GPU core temperature", "gpu", semconv=True),
    MetricSpec("tunix.gpu.clock.sm", G, "Hz", "SM clock (no convention in hw.gpu.*)", "gpu"),
    # --- process, host, framework, queues ---------------------------------------------
    MetricSpec(
        "process.cpu.utilization",
        G,
        "1",
        "Process CPU time per wall time per available CPU since the last sample",
        "system",
        semconv=True,
    ),
    MetricSpec(
        "process.cpu.time",
        C,
        "s",
        "Process CPU time, by cpu.mode (user, system)",
        "system",
        semconv=True,
    ),
    MetricSpec(
        "process.memory.usage",
        U,
        "By",
        "Resident set size of the process",
        "system",
        semconv=True,
    ),
    MetricSpec(
        "system.memory.usage",
        U,
        "By",
        "Host memory in use",
        "system",
        attributes={"system.memory.state": "used"},
        semconv=True,
    ),
    MetricSpec("system.memory.limit", U, "By", "Host memory", "system", semconv=True),
    MetricSpec(
        "system.memory.utilization",
        G,
        "1",
        "Fraction of host memory in use",
        "system",
        attributes={"system.memory.state": "used"},
        semconv=True,
    ),
    MetricSpec(
        "tunix.memory.allocated",
        G,
        "By",
        "Device memory held by tensors (torch memory_allocated, JAX bytes_in_use)",
        "system",
        "memory/allocated_bytes",
    ),
    MetricSpec(
        "tunix.memory.reserved",
        G,
        "By",
        "Device memory reserved by the framework's allocator",
        "system",
        "memory/reserved_bytes",
    ),
    MetricSpec(
        "tunix.memory.peak_allocated",
        G,
        "By",
        "Peak device memory held by tensors",
        "system",
        "memory/peak_allocated_bytes",
    ),
    MetricSpec(
        "tunix.memory.limit",
        G,
        "By",
        "Device memory the framework may use (JAX bytes_limit)",
        "system",
        "memory/limit_bytes",
    ),
    MetricSpec(
        "tunix.memory.alloc_retries",
        C,
        "{retry}",
        "Allocation retries of torch's CUDA caching allocator (num_alloc_retries), per step",
        "system",
        "memory/alloc_retries",
    ),
    MetricSpec(
        "tunix.memory.ooms",
        C,
        "{error}",
        "Out-of-memory errors of torch's CUDA caching allocator (num_ooms), per step",
        "system",
        "memory/ooms",
    ),
    MetricSpec(
        "tunix.queue.depth",
        G,
        "{item}",
        "Items waiting in an instrumented queue",
        "system",
    ),
    # --- alerts -------------------------------------------------------------------------
    MetricSpec(
        "tunix.alert.firings",
        C,
        "{alert}",
        "Alert episodes started or escalated, by rule and severity",
        "alerts",
    ),
    # --- compilation (issue 29) ------------------------------------------------------------
    MetricSpec(
        "tunix.compilations",
        C,
        "{compilation}",
        "Compilations: XLA compilations of JAX (jit cache misses) and frames compiled by "
        "torch.compile (dynamo), by framework and cause (first_call, new_shapes, "
        "new_dtypes, other, unknown); JAX's also by function",
        "compilation",
    ),
    MetricSpec(
        "tunix.run.goodput",
        G,
        "1",
        "Productive time over the wall time since the process started (0..1; docs/goodput.md)",
        "goodput",
        "goodput",
    ),
    MetricSpec(
        "tunix.run.badput_time",
        C,
        "s",
        "Seconds of the run so far in each badput category (docs/goodput.md)",
        "goodput",
        "badput_time/{category}",
    ),
]

CATALOG: Final[tuple[MetricSpec, ...]] = tuple(_ROWS)
"""Every metric otel-tunix defines, in documentation order."""

_BY_LOGGER: Final = MappingProxyType(
    {s.logger_name: s for s in CATALOG if s.logger_name and "{" not in s.logger_name}
)
_BY_OTEL: Final = MappingProxyType({s.otel_name: s for s in reversed(CATALOG)})  # first row wins
_PATTERNS: Final = tuple(
    (
        re.compile(
            "^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(s.logger_name)) + "$"
        ),
        s,
    )
    for s in CATALOG
    if s.logger_name and "{" in s.logger_name
)


@dataclass(frozen=True, slots=True)
class Match:
    """A logged name resolved against the catalog: its row and the series' attributes."""

    spec: MetricSpec
    attributes: Mapping[str, str]


def lookup(logger_name: str) -> Match | None:
    """The catalog row of a MetricsLogger name, or ``None`` if it is not catalogued.

    Exact names win over patterns: ``rewards/mean`` is the batch mean, ``rewards/format``
    is reward function ``format``.
    """
    spec = _BY_LOGGER.get(logger_name)
    if spec is not None:
        return Match(spec, spec.attributes)
    for pattern, spec in _PATTERNS:
        m = pattern.match(logger_name)
        if m is not None:
            return Match(spec, {**spec.attributes, **m.groupdict()})
    return None


def by_otel_name(otel_name: str) -> MetricSpec:
    """The (first) catalog row of an OTel instrument name: rows that share an instrument
    (``loss`` and ``eval/loss`` are ``tunix.training.loss``) differ in their attributes.

    Raises:
        KeyError: the name is not in the catalog.
    """
    return _BY_OTEL[otel_name]


def rows(group: str | None = None) -> Iterator[MetricSpec]:
    """Catalog rows, optionally of one group."""
    return (s for s in CATALOG if group is None or s.group == group)


def guess_unit(logger_name: str) -> str:
    """The unit of a name that is not in the catalog, from its suffix (else ``1``)."""
    last = logger_name.rsplit("/", 1)[-1]
    if last.endswith(("_per_sec", "_per_second", "/s")):
        return "1/s"
    if last.endswith(("_sec", "_seconds", "_time", "_latency", "_duration")):
        return "s"
    if last.endswith(("_bytes", "_memory")):
        return "By"
    if last.endswith(("tokens", "_length", "_len")):
        return "{token}"
    return "1"


def markdown_table(group: str | None = None) -> str:
    """The catalog (or one group of it) as a Markdown table, as in ``docs/metrics.md``."""
    head = (
        "| MetricsLogger name | OTel instrument | kind | unit | attributes | description |\n"
        "|---|---|---|---|---|---|"
    )
    lines = [head]
    for s in rows(group):
        name = f"`{s.logger_name}`" if s.logger_name else "—"
        otel = f"`{s.otel_name}`" + (" (semconv)" if s.semconv else "")
        attrs = ", ".join(f"`{k}={v}`" for k, v in s.attributes.items())
        if s.logger_name and "{" in s.logger_name:
            keys = re.findall(r"\{(\w+)\}", s.logger_name)
            attrs = ", ".join([attrs, *(f"`{k}`" for k in keys)]).strip(", ")
        unit = f"`{s.unit}`" + (f" (logged x{1 / s.scale:g})" if s.scale != 1.0 else "")
        desc = s.description.replace("|", "\\|")
        lines.append(f"| {name} | {otel} | {s.instrument.value} | {unit} | {attrs} | {desc} |")
    return "\n".join(lines)
