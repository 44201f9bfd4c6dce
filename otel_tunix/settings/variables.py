"""The ``OTEL_TUNIX_*`` environment variables, in one place.

Every setting resolves in the same order: the argument given to :func:`otel_tunix.configure`
(or to a config object), then the environment variable, then the default. The standard
``OTEL_*`` variables of the OpenTelemetry SDK (``OTEL_SDK_DISABLED``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``,
``OTEL_EXPORTER_OTLP_*``, ...) keep their meaning and are not repeated here.
"""

from __future__ import annotations

from typing import Final

OTEL_TUNIX_ENABLED: Final = "OTEL_TUNIX_ENABLED"
"""``true`` / ``false``: record step and component spans. Default: ``true``."""

OTEL_TUNIX_SAMPLING_RATE: Final = "OTEL_TUNIX_SAMPLING_RATE"
"""Positive integer N: instrument the steps whose number is divisible by N. Default: ``1``."""

OTEL_TUNIX_COMPONENTS: Final = "OTEL_TUNIX_COMPONENTS"
"""Comma-separated component names to record; empty or unset records all. Default: all."""

OTEL_TUNIX_SCOPE: Final = "OTEL_TUNIX_SCOPE"
"""Instrumentation scope (tracer and meter name) of otel-tunix's spans and instruments.
Default: ``tunix``."""

OTEL_TUNIX_OUTPUT_DIR: Final = "OTEL_TUNIX_OUTPUT_DIR"
"""Local run folder (spans JSONL, metrics JSONL, summary). ``none`` turns the local folder
off; a later run given a folder that an earlier run wrote goes to ``<folder>/run-2``,
``run-3``, ... Default: ``./otel-tunix-runs/<run id>``."""

OTEL_TUNIX_EXPORT_JSONL_PATH: Final = "OTEL_TUNIX_EXPORT_JSONL_PATH"
"""An extra spans JSONL file (one line per sampled step); ``.gz`` writes gzip. Default: unset."""

OTEL_TUNIX_EXPORT_FN: Final = "OTEL_TUNIX_EXPORT_FN"
"""Import path ``pkg.mod:fn`` of a custom export function that receives each finished
:class:`~otel_tunix.model.steps.StepSummary` and returns ``{metric name: value}``.
Default: unset."""

OTEL_TUNIX_RUN_ID: Final = "OTEL_TUNIX_RUN_ID"
"""Run id, the ``tunix.run.id`` resource attribute. Default: derived from the job id and the
attempt (the job id for attempt 1, ``<job id>-attempt<n>`` for a later one) so all ranks of
an attempt share it and two attempts never do, else a new ``<date>-<time>-<random>`` id."""

OTEL_TUNIX_JOB_ID: Final = "OTEL_TUNIX_JOB_ID"
"""Job id, the ``tunix.job.id`` resource attribute: the runs that share it are attempts of
one job (restarts, preemptions). Default: ``tunix.job.id`` of ``OTEL_RESOURCE_ATTRIBUTES``,
else the launcher's (``torchelastic-<TORCHELASTIC_RUN_ID>``, ``slurm-<SLURM_JOB_ID>``), else
the run id (a run is a job of its own)."""

OTEL_TUNIX_JOB_ATTEMPT: Final = "OTEL_TUNIX_JOB_ATTEMPT"
"""Which attempt of its job the run is (1-based), the ``tunix.job.attempt`` resource
attribute. Default: ``tunix.job.attempt`` of ``OTEL_RESOURCE_ATTRIBUTES``, else the
launcher's restart count + 1 (``TORCHELASTIC_RESTART_COUNT``, ``SLURM_RESTART_COUNT``), else
one more than the highest attempt of the job found in the local run folders, else 1. A value
that is not a whole number >= 1 is reported (naming the variable) and ignored."""

OTEL_TUNIX_LOG_ALL_RANKS: Final = "OTEL_TUNIX_LOG_ALL_RANKS"
"""``true``: every rank's MetricsLogger logs scalars. Default: ``false`` (rank 0 only)."""

OTEL_TUNIX_QUIET: Final = "OTEL_TUNIX_QUIET"
"""``true``: no notes on stderr at ``configure()`` (where the run's data goes) and
``shutdown()`` (where it went, what to run next). Default: ``false`` (rank 0 prints them)."""

OTEL_TUNIX_CONSOLE_INTERVAL: Final = "OTEL_TUNIX_CONSOLE_INTERVAL"
"""Seconds between live lines on stderr (step, loss, tokens/s, step time, busy / blocked /
idle %), printed from a background thread by rank 0. Default: unset (no live line)."""

OTEL_TUNIX_PERFETTO_DIR: Final = "OTEL_TUNIX_PERFETTO_DIR"
"""Directory for Perfetto trace files streamed from the spans during the run; ``none`` turns
them off. Default: unset; the local run folder then gets ``trace.pftrace`` translated from
its spans JSONL at shutdown, when the ``perfetto`` package is installed."""

OTEL_TUNIX_PROCESS_INTERVAL_MS: Final = "OTEL_TUNIX_PROCESS_INTERVAL_MS"
"""Longest time in milliseconds between two batches of finished steps being processed off
the training thread (and the local files flushed); a hard kill loses at most about this much
of the most recent steps. Default: ``250``."""

OTEL_TUNIX_JOB_TRACES: Final = "OTEL_TUNIX_JOB_TRACES"
"""With several ranks: step n of a scope is one trace on every rank (ids derived from the
run id), each rank's step span under a ``<scope>_job_step`` root that rank 0 exports.
Default: ``true``."""

OTEL_TUNIX_STRAGGLER_WINDOW: Final = "OTEL_TUNIX_STRAGGLER_WINDOW"
"""With several ranks under ``torch.distributed`` or ``jax.distributed``: every this many
sampled steps of the straggler scope the ranks compare their mean step times; ``0`` turns it
off. Default: ``50``."""

OTEL_TUNIX_STRAGGLER_SCOPE: Final = "OTEL_TUNIX_STRAGGLER_SCOPE"
"""The scope whose steps the ranks compare for stragglers. Default: ``train``."""

OTEL_TUNIX_STRAGGLER_MARGIN: Final = "OTEL_TUNIX_STRAGGLER_MARGIN"
"""How much slower than the ranks' median step time a rank is slow in a window (``0.2``:
20 %). Default: ``0.2``."""

OTEL_TUNIX_STRAGGLER_WINDOWS: Final = "OTEL_TUNIX_STRAGGLER_WINDOWS"
"""Windows in a row a rank is slow before the ``straggler`` alert fires. Default: ``3``."""

OTEL_TUNIX_SHUTDOWN_TIMEOUT: Final = "OTEL_TUNIX_SHUTDOWN_TIMEOUT"
"""Seconds that ``shutdown()`` (also at exit and on SIGTERM) takes at most, whatever the
collector does: the local files are finished first, exporters that have not finished by then
are left behind and ``summary.json`` says so. Default: ``5``."""

OTEL_TUNIX_RESOURCE_CONFIG_KEYS: Final = "OTEL_TUNIX_RESOURCE_CONFIG_KEYS"
"""Comma-separated keys of the run config (``configure(run_config=)``, dotted for nested
ones; ``fnmatch`` patterns such as ``model.*``) that also go on the OTel resource as
``tunix.config.<key>``; ``*`` for all. The resource goes with every export and becomes
Prometheus ``target_info`` labels, so nothing goes there unless named. Secret-looking keys
are redacted whatever this says. Default: unset (none; the config stays in ``config.json``)."""

OTEL_TUNIX_MAX_METRIC_NAMES: Final = "OTEL_TUNIX_MAX_METRIC_NAMES"
"""Distinct names a MetricsLogger accepts in ``log()`` / ``log_dict()``; values of names past
it are refused (one warning, counted in ``summary.json``): each name costs an OTel
instrument and per-name state for the rest of the run. Default: ``2000``."""

OTEL_TUNIX_ALERTS: Final = "OTEL_TUNIX_ALERTS"
"""``true`` / ``false``: evaluate the default alert rules on every logged metric
(:mod:`otel_tunix.metrics.alerts`). Default: ``true``."""

OTEL_TUNIX_MAX_POLICY_LAG: Final = "OTEL_TUNIX_MAX_POLICY_LAG"
"""The bound of the ``policy_lag`` alert rule: it fires when a learner step trained on a
rollout more than this many policy versions old (the MetricsLogger's ``policy_lag``, from
:func:`otel_tunix.rl.consume`). Default: unset (no rule)."""

OTEL_TUNIX_PROFILE_ON_ALERT: Final = "OTEL_TUNIX_PROFILE_ON_ALERT"
"""``true`` / ``false``: when an alert fires on a rank, that rank profiles its next
``OTEL_TUNIX_PROFILE_STEPS`` steps with the framework's profiler (torch or JAX), one file or
folder per capture under ``<run folder>/profiles/`` (:mod:`otel_tunix.metrics.profiling`).
Default: ``true``."""

OTEL_TUNIX_PROFILER: Final = "OTEL_TUNIX_PROFILER"
"""``auto``, ``torch`` or ``jax``: the profiler of the profile captures. ``auto``: JAX's when
jax is imported and torch is not, or both are and Tunix or Flax is too (a JAX loop that
imported torch through transformers); else torch's when torch is imported. Default:
``auto``."""

OTEL_TUNIX_PROFILE_STEPS: Final = "OTEL_TUNIX_PROFILE_STEPS"
"""Steps one profile capture covers. Default: ``3``."""

OTEL_TUNIX_PROFILE_MAX_CAPTURES: Final = "OTEL_TUNIX_PROFILE_MAX_CAPTURES"
"""Profile captures alerts may start per run (further ones are skipped and counted in
``summary.json``; ``otel_tunix.capture_profile()`` is not capped). Default: ``3``."""

OTEL_TUNIX_PROFILE_COOLDOWN_STEPS: Final = "OTEL_TUNIX_PROFILE_COOLDOWN_STEPS"
"""Steps after a capture ends before an alert may start the next one. Default: ``50``."""

OTEL_TUNIX_SYSTEM_METRICS_INTERVAL: Final = "OTEL_TUNIX_SYSTEM_METRICS_INTERVAL"
"""Seconds between samples of the GPU / process / host metrics
(:class:`~otel_tunix.metrics.system.SystemMetricsSampler`); ``0`` or ``none`` turns the
sampler off. Default: ``10``."""

OTEL_TUNIX_RAISE_INTERNAL_ERRORS: Final = "OTEL_TUNIX_RAISE_INTERNAL_ERRORS"
"""``true``: an internal error of otel-tunix is re-raised instead of being reported once
and skipped (the test suite sets it, so a swallowed bug fails a test). Default: ``false``."""

OTEL_TUNIX_OTLP_FAST_PATH: Final = "OTEL_TUNIX_OTLP_FAST_PATH"
"""``true``: with ``OTEL_TRACES_EXPORTER=otlp``, otel-tunix encodes its steps' OTLP
protobuf itself and sends it through the SDK's OTLP exporter (:mod:`otel_tunix.exporters.otlp`);
``false``: the SDK's OTLP span exporter as it is. Default: ``true``."""

OTEL_TUNIX_METRICS_FAST_PATH: Final = "OTEL_TUNIX_METRICS_FAST_PATH"
"""``true``: the step and component histograms are aggregated by otel-tunix per batch of
steps and handed to the MeterProvider's readers as finished points
(:mod:`otel_tunix.consumers.step_histograms`); ``false``: recorded through the SDK's
instruments, one call per value. Default: ``true``."""

OTEL_TUNIX_PROMETHEUS_RUN_LABELS: Final = "OTEL_TUNIX_PROMETHEUS_RUN_LABELS"
"""Label every series of the ``/metrics`` endpoint with ``service`` and ``run_id``.
Default: ``true``."""

OTEL_TUNIX_PROMETHEUS_HOST: Final = "OTEL_TUNIX_PROMETHEUS_HOST"
"""Host of the Prometheus ``/metrics`` endpoint (``OTEL_METRICS_EXPORTER=prometheus``);
beats the SDK's ``OTEL_EXPORTER_PROMETHEUS_HOST``. Default: ``127.0.0.1``."""

OTEL_TUNIX_PROMETHEUS_PORT: Final = "OTEL_TUNIX_PROMETHEUS_PORT"
"""Port of the Prometheus ``/metrics`` endpoint (``0``: a free port); beats the SDK's
``OTEL_EXPORTER_PROMETHEUS_PORT``. Default: a free port."""
