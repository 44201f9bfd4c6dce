"""Attribute keys that otel-tunix puts on spans and metrics.

Spans carry ``tunix.*`` keys; metric instruments carry the short ``scope`` and
``component`` keys so that they read naturally as Prometheus labels and Datadog tags.
"""

from __future__ import annotations

from typing import Final

# --- span attributes -------------------------------------------------------------------
STEP: Final = "tunix.step"
"""Step number (int) on step spans and on every component span of that step."""
SCOPE: Final = "tunix.scope"
"""Scope of the step: ``train``, ``eval``, ``rl/actor``, ``rl/learner`` or any string."""
COMPONENT: Final = "tunix.component"
"""Component name on component spans (same as the span name)."""
TIME_KIND: Final = "tunix.time_kind"
"""``busy`` or ``blocked`` on component spans."""
SPAN_TYPE: Final = "tunix.span.type"
"""``step`` or ``component``: which kind of otel-tunix span this is."""
HOST_DURATION: Final = "tunix.host_duration_s"
"""Host-side duration in seconds, set when the span ended at device completion."""
DEVICE_DURATION: Final = "tunix.device_duration_s"
"""Device-side duration in seconds (CUDA events), beside the host time."""
DEVICE_END: Final = "tunix.device_end"
"""True when the span's end time is the device completion time."""
INCOMPLETE: Final = "tunix.incomplete"
"""True when a component was still open at shutdown and was closed by otel-tunix."""
STEP_ABANDONED: Final = "tunix.step.abandoned"
"""True on a step span that was left open (a generator abandoned or thrown into, a step
exited on another thread) and closed by otel-tunix when the next step of its scope began."""
COMPILE_TRIGGER: Final = "tunix.compile.trigger"
"""On a compile component: what made the compiler run (torch.compile: ``dynamo`` for a frame
compiled, ``lazy_backward`` for the backward graph of a frame compiled earlier, which is
compilation time of that frame's compilation, not a compilation of its own)."""
LAZY_BACKWARD: Final = "lazy_backward"
"""The :data:`COMPILE_TRIGGER` of a backward graph compiled when it first runs."""
BACKGROUND: Final = "tunix.background"
"""True on a component that ran on another thread than its step's and was open at an edge
of that step's window (an async checkpoint writer): counted in every step whose window it
overlaps, for the overlap, as background time beside the step's busy / blocked / idle."""
THREAD_ID: Final = "thread.id"
"""Semantic-convention thread id of the thread that ran the span."""
THREAD_NAME: Final = "thread.name"
"""Semantic-convention thread name of the thread that ran the span."""

EVAL_ROUND: Final = "tunix.eval.round"
"""On an evaluation step: which evaluation of the run it belongs to (0, 1, ...)."""
EVAL_BATCH: Final = "tunix.eval.batch"
"""On an evaluation step: its batch within the evaluation (0, 1, ...)."""
EVAL_AFTER_STEP: Final = "tunix.eval.train_step"
"""On an evaluation step: the training step after which the evaluation ran."""
OUTSIDE: Final = "tunix.outside"
"""True on a component recorded outside any step (a checkpoint restore before the loop, an
evaluation between steps, a writer after the last step): the root of a trace of its own,
its nested components its children; it has no ``tunix.step`` or ``tunix.scope``."""
PROFILE_PATH: Final = "tunix.profile.path"
"""On a profiled step's span and on the alert that asked for the capture: the profile
capture's path relative to the run folder (:mod:`otel_tunix.metrics.profiling`)."""
MEMORY_ALLOC_RETRIES: Final = "tunix.memory.alloc_retries"
"""On a step span (torch with CUDA): the CUDA caching allocator's allocation retries during
the step (a failed ``cudaMalloc`` that freed the cache and tried again)."""
MEMORY_OOMS: Final = "tunix.memory.ooms"
"""On a step span (torch with CUDA): the allocator's out-of-memory errors during the step."""
MEMORY_PEAK_ALLOCATED: Final = "tunix.memory.peak_allocated"
"""On a step span (torch with CUDA; JAX where ``Device.memory_stats()`` answers): peak bytes
held by tensors during the step (JAX: ``peak_bytes_in_use``, since the process started)."""
MEMORY_RESERVED: Final = "tunix.memory.reserved"
"""On a step span (torch with CUDA; JAX where it reports ``pool_bytes``): bytes reserved by
the allocator at the step's end."""
MEMORY_LIMIT: Final = "tunix.memory.limit"
"""On a step span (JAX on a device that reports it): bytes the framework may use
(``bytes_limit``)."""
MEMORY_OOM: Final = "tunix.memory.oom"
"""True on a step span when an out-of-memory error (``torch.cuda.OutOfMemoryError``) was
raised inside the step or one of its components."""
GOODPUT_CATEGORY: Final = "tunix.goodput.category"
"""On a component recorded with a goodput category (``component(name,
category=...)``, :func:`otel_tunix.accounting.categories.declare`): that category."""

SPAN_TYPE_STEP: Final = "step"
SPAN_TYPE_COMPONENT: Final = "component"
KIND_BUSY: Final = "busy"
KIND_BLOCKED: Final = "blocked"

# --- resource attributes ---------------------------------------------------------------
RUN_ID: Final = "tunix.run.id"
RANK: Final = "tunix.rank"
LOCAL_RANK: Final = "tunix.local_rank"
WORLD_SIZE: Final = "tunix.world_size"
JOB_ID: Final = "tunix.job.id"
"""The job the run is an attempt of (``OTEL_TUNIX_JOB_ID``, else the launcher's job id, else
the run id): the runs of a job share it."""
JOB_ATTEMPT: Final = "tunix.job.attempt"
"""Which attempt of its job the run is (int, from 1)."""

# --- link attributes -------------------------------------------------------------------
LINK_TYPE: Final = "tunix.link.type"
"""What a link of otel-tunix's points at: ``previous_attempt`` (from a run's first step span
to the previous attempt of its job)."""
LINK_SOURCE: Final = "tunix.link.source"
"""How the linked span was found: ``run_folder`` (the previous attempt's last recorded step,
read from its spans JSONL) or ``derived`` (ids derived from the job id and attempt: no record
of that attempt was found, so the link names no recorded span)."""

LINK_TYPE_ROLLOUT: Final = "rollout"
"""``tunix.link.type`` of a link from a learner step span to a rollout span it trained on
(:func:`otel_tunix.rl.consume`)."""

# --- RL lineage (otel_tunix.rl) --------------------------------------------------------
RL_POLICY_VERSION: Final = "tunix.rl.policy_version"
"""On a rollout link: the policy version the rollout was generated with. On a learner step
span: the learner's policy version when it consumed its rollouts."""
RL_POLICY_LAG: Final = "tunix.rl.policy_lag"
"""On a rollout link: the learner's version at consumption minus the rollout's (in learner
steps; the ``tunix.rl.policy_lag`` histogram counts the same values). On a learner step
span: the largest among the rollouts it consumed (the learner's version minus the oldest
rollout's), as the Tunix orchestrator integration sets it too."""
RL_ROLLOUTS: Final = "tunix.rl.rollouts"
"""On a learner step span: how many rollout contexts it consumed (linked or not)."""
RL_WEIGHT_SYNCS: Final = "tunix.rl.weight_sync.count"
"""On a learner step span: the weight syncs it made (:func:`otel_tunix.rl.weight_sync`)."""
RL_WEIGHT_SYNC_BYTES: Final = "tunix.rl.weight_sync.bytes"
"""On a learner step span: the bytes its weight syncs moved, as the caller gave them."""
RL_LINKS_DROPPED: Final = "tunix.rl.links_dropped"
"""On a learner step span: rollouts it consumed past the link bound
(:data:`otel_tunix.rl.MAX_ROLLOUT_LINKS`), counted but not linked."""

# --- metric attributes -----------------------------------------------------------------
STEP_DURATION: Final = "tunix.step.duration"
"""On a step span: the step's time in seconds (its host window, as ``tunix.step.duration``)."""
STEP_BUSY_TIME: Final = "tunix.step.busy_time"
"""On a step span: seconds with at least one busy component open."""
STEP_BLOCKED_TIME: Final = "tunix.step.blocked_time"
"""On a step span: seconds with a blocked component open and no busy one."""
STEP_IDLE_TIME: Final = "tunix.step.idle_time"
"""On a step span: the rest of the step's time, in seconds."""
STEP_BACKGROUND_TIME: Final = "tunix.step.background_time"
"""On a step span with background work: seconds of the step's window in which a background
component (another thread's work that crossed a step's edge) was open."""
COMPONENT_BUSY_TIME: Final = "tunix.component.busy_time"
"""On a component span: the busy seconds of the component's name in the step (all its
spans in the step together, as the ``tunix.component.busy_time`` histogram counts them)."""
COMPONENT_BLOCKED_TIME: Final = "tunix.component.blocked_time"
"""On a component span: the blocked seconds of the component's name in the step."""
COMPONENT_COUNT: Final = "tunix.component.count"
"""On a component span: spans of the component's name in the step, when more than one."""

METRIC_SCOPE: Final = "scope"
METRIC_COMPONENT: Final = "component"


def for_ledger(attributes: dict[str, object] | None, own: bool) -> dict[str, object] | None:
    """A component's own ``attributes`` (``own``), or only those the goodput ledger reads
    (a compile's :data:`COMPILE_TRIGGER`: what the spans JSONL keeps of them)."""
    if own or not attributes:
        return attributes
    trigger = attributes.get(COMPILE_TRIGGER)
    return {COMPILE_TRIGGER: trigger} if trigger is not None else None
