"""Every environment variable otel-tunix reads, in one table, read in one place.

:data:`SETTINGS` lists each variable with its type, default, documentation and parser
(:mod:`~otel_tunix.settings.parsing`); :func:`~otel_tunix.settings.values.load_settings`
reads them all into a frozen :class:`~otel_tunix.settings.values.Settings` (``configure()``
does it once per run and hands the values to what it builds). A value that does not parse is
a :class:`~otel_tunix.settings.parsing.ConfigurationError` naming the variable and what is
allowed. The README's configuration table is checked against this table by the test suite.

Variables the OpenTelemetry SDK and its exporters read themselves (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS``, ...) and those the ``datadog``
client reads (``DD_AGENT_HOST``, ``DD_ENV``, ...) are listed with ``read_by`` naming the
reader: documented here, parsed there.

The shape follows Logfire's ``config_params.py``: one table, loaded and cast in one place.
"""

from __future__ import annotations

from typing import Final

from otel_tunix.settings import variables as env
from otel_tunix.settings.datadog_settings import DATADOG_CLIENT_SETTINGS
from otel_tunix.settings.parsing import (
    BOOL,
    MAX_INTERVAL_MS,
    MAX_SHUTDOWN_SEC,
    PEM,
    Setting,
    _components,
    _names,
    _non_negative_int,
    _pem_file,
    _port,
    _positive_float,
    _positive_int,
    _protocol,
    _seconds,
    _seconds_or_off,
    _text,
    _url,
    parse_bool,
    parse_interval_ms,
)
from otel_tunix.settings.profile_settings import PROFILE_SETTINGS

__all__ = ["SETTINGS", "markdown_table"]


_BOOL = BOOL
_EXPORTERS = "a comma-separated list of exporter names, or none"
_URL = "a URL with its scheme (`http://host:4317`, `https://host:4318`)"

DEFAULT_SCOPE = "otel_tunix"
"""The default instrumentation scope (tracer and meter name) of otel-tunix's spans and
metrics: not ``tunix``, the meter name of upstream Tunix's own OpenTelemetry metrics."""

SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        env.OTEL_TUNIX_ENABLED,
        "enabled",
        parse_bool,
        True,
        "record step and component spans",
        _BOOL,
    ),
    Setting(
        env.OTEL_TUNIX_SAMPLING_RATE,
        "sampling_rate",
        _positive_int,
        1,
        "record steps whose number is divisible by N",
        "a positive integer (1 = every step, N = every N-th step)",
    ),
    Setting(
        env.OTEL_TUNIX_COMPONENTS,
        "components",
        _components,
        None,
        "comma-separated component names to record (unset: all)",
        "comma-separated component names",
    ),
    Setting(
        env.OTEL_TUNIX_SCOPE,
        "scope",
        _text,
        DEFAULT_SCOPE,
        "instrumentation scope (tracer and meter name)",
        "a non-empty name",
    ),
    Setting(
        env.OTEL_TUNIX_OUTPUT_DIR,
        "output_dir",
        _text,
        None,
        "local run folder; `none` turns it off (unset: `./otel-tunix-runs/<run id>`); "
        "a later run given a folder an earlier run wrote goes to `<folder>/run-2`, ...",
        "a directory path or none",
    ),
    Setting(
        env.OTEL_TUNIX_EXPORT_JSONL_PATH,
        "export_jsonl_path",
        _text,
        None,
        "extra spans JSONL file (`.gz` writes gzip)",
        "a file path",
    ),
    Setting(
        env.OTEL_TUNIX_EXPORT_FN,
        "export_fn",
        _text,
        None,
        "custom export function `pkg.mod:fn`",
        "an import path 'pkg.module:function'",
    ),
    Setting(
        env.OTEL_TUNIX_RUN_ID,
        "run_id",
        _text,
        None,
        "run id (`tunix.run.id`; unset: the job id for a job's first attempt, "
        "`<job id>-attempt<n>` for a later one, else a new id)",
        "a non-empty id",
    ),
    Setting(
        env.OTEL_TUNIX_JOB_ID,
        "job_id",
        _text,
        None,
        "job id (`tunix.job.id`): the runs that share it are attempts of one job "
        "(unset: `tunix.job.id` of `OTEL_RESOURCE_ATTRIBUTES`, else the launcher's, "
        "else the run id)",
        "a non-empty id",
    ),
    Setting(
        env.OTEL_TUNIX_JOB_ATTEMPT,
        "job_attempt",
        _text,
        None,
        "which attempt of its job the run is (`tunix.job.attempt`; unset: "
        "`tunix.job.attempt` of `OTEL_RESOURCE_ATTRIBUTES`, else the launcher's "
        "restart count + 1, else one more than the job's runs found in the local run "
        "folders, else 1); a value not allowed is reported and ignored",
        "a whole number >= 1",
    ),
    Setting(
        env.OTEL_TUNIX_LOG_ALL_RANKS,
        "log_all_ranks",
        parse_bool,
        False,
        "every rank's MetricsLogger logs scalars (default: rank 0 only)",
        _BOOL,
    ),
    Setting(
        env.OTEL_TUNIX_QUIET,
        "quiet",
        parse_bool,
        False,
        "no notes on stderr at `configure()` (run folder, destinations, sampling) and "
        "`shutdown()` (steps, anything dropped, what to run next); rank 0 prints them",
        _BOOL,
    ),
    Setting(
        env.OTEL_TUNIX_CONSOLE_INTERVAL,
        "console_interval",
        _seconds_or_off,
        None,
        "print a live line on stderr every N seconds (step, loss, tokens/s, step time, "
        "busy / blocked / idle %; rank 0, from a background thread); unset: none",
        "a number of seconds > 0, or 0 / none",
    ),
    Setting(
        env.OTEL_TUNIX_PERFETTO_DIR,
        "perfetto_dir",
        _text,
        None,
        "stream a Perfetto trace into this directory during the run; `none` turns "
        "Perfetto off (unset: the run folder gets `trace.pftrace` at shutdown)",
        "a directory path or none",
    ),
    Setting(
        env.OTEL_TUNIX_PROCESS_INTERVAL_MS,
        "process_interval_ms",
        parse_interval_ms,
        250.0,
        "longest wait before finished steps are processed off the training thread and "
        "the local files flushed (a hard kill loses at most about this much)",
        f"a number of milliseconds in (0, {MAX_INTERVAL_MS:g}]",
    ),
    Setting(
        env.OTEL_TUNIX_SHUTDOWN_TIMEOUT,
        "shutdown_timeout",
        _seconds,
        5.0,
        "longest time `shutdown()` takes (also at exit and on SIGTERM), whatever the "
        "collector does: local files first, then the exporters; what they could not send "
        "is counted in `summary.json`",
        f"a number of seconds in (0, {MAX_SHUTDOWN_SEC:g}]",
    ),
    Setting(
        env.OTEL_TUNIX_RESOURCE_CONFIG_KEYS,
        "resource_config_keys",
        _components,
        None,
        "run config keys (`configure(run_config=)`; dotted for nested ones, `fnmatch` "
        "patterns, `*` for all) also put on the OTel resource as `tunix.config.<key>`; "
        "unset: none (the config stays in `config.json`); secret-looking keys are "
        "redacted whatever this says",
        "comma-separated keys or patterns",
    ),
    Setting(
        env.OTEL_TUNIX_MAX_METRIC_NAMES,
        "max_metric_names",
        _positive_int,
        2000,
        "distinct names a MetricsLogger accepts; values of names past it are refused, "
        "counted in `summary.json` (each name holds an OTel instrument for the run)",
        "a positive integer",
    ),
    Setting(
        env.OTEL_TUNIX_ALERTS,
        "alerts",
        parse_bool,
        True,
        "evaluate the default alert rules on logged metrics",
        _BOOL,
    ),
    *PROFILE_SETTINGS,  # settings/profile_settings.py
    Setting(
        env.OTEL_TUNIX_JOB_TRACES,
        "job_traces",
        parse_bool,
        True,
        "with several ranks: step n of a scope is one trace on every rank (ids derived "
        "from the run id), each rank's step span under a `<scope>_job_step` root that "
        "rank 0 exports",
        _BOOL,
    ),
    Setting(
        env.OTEL_TUNIX_STRAGGLER_WINDOW,
        "straggler_window",
        _non_negative_int,
        50,
        "with several ranks under `torch.distributed` or `jax.distributed`: every this "
        "many sampled steps of "
        "the straggler scope the ranks compare their mean own times (step time minus "
        "blocked time; off the training thread, over the job's store); `0` turns it off",
        "a whole number >= 0",
    ),
    Setting(
        env.OTEL_TUNIX_STRAGGLER_SCOPE,
        "straggler_scope",
        _text,
        "train",
        "the scope whose steps the ranks compare",
        "a scope name",
    ),
    Setting(
        env.OTEL_TUNIX_STRAGGLER_MARGIN,
        "straggler_margin",
        _positive_float,
        0.2,
        "how much slower than the ranks' median own time a rank is slow in a window (`0.2`: 20 %)",
        "a number > 0",
    ),
    Setting(
        env.OTEL_TUNIX_STRAGGLER_WINDOWS,
        "straggler_windows",
        _positive_int,
        3,
        "windows in a row a rank is slow before the `straggler` alert fires",
        "a whole number >= 1",
    ),
    Setting(
        env.OTEL_TUNIX_MAX_POLICY_LAG,
        "max_policy_lag",
        _non_negative_int,
        None,
        "RL: the `policy_lag` alert's bound, in policy versions (`otel_tunix.rl`); unset: none",
        "a whole number >= 0",
    ),
    Setting(
        env.OTEL_TUNIX_SYSTEM_METRICS_INTERVAL,
        "system_metrics_interval",
        _seconds_or_off,
        10.0,
        "seconds between GPU / process / host samples; `0` or `none` turns it off",
        "a number of seconds > 0, or 0 / none",
    ),
    Setting(
        env.OTEL_TUNIX_RAISE_INTERNAL_ERRORS,
        "raise_internal_errors",
        parse_bool,
        False,
        "re-raise otel-tunix's internal errors instead of reporting them once "
        "(the test suite sets it)",
        _BOOL,
    ),
    Setting(
        env.OTEL_TUNIX_OTLP_FAST_PATH,
        "otlp_fast_path",
        parse_bool,
        True,
        "encode spans for the OTLP exporter from the steps directly (same bytes, ~10x "
        "less CPU); `false`: the SDK's OTLP span exporter as it is",
        _BOOL,
    ),
    Setting(
        env.OTEL_TUNIX_METRICS_FAST_PATH,
        "metrics_fast_path",
        parse_bool,
        True,
        "aggregate the step and component histograms per batch of steps and hand the "
        "readers finished points (same points, ~20x less CPU); `false`: the SDK's "
        "instruments, one call per value",
        _BOOL,
    ),
    Setting(
        env.OTEL_TUNIX_PROMETHEUS_RUN_LABELS,
        "prometheus_run_labels",
        parse_bool,
        True,
        "label every series of the `/metrics` endpoint with `service` and `run_id`, so "
        "one Prometheus scraping several jobs tells them apart without a join on "
        "`target_info`",
        _BOOL,
    ),
    Setting(
        env.OTEL_TUNIX_PROMETHEUS_HOST,
        "prometheus_host",
        _text,
        None,
        "host of the `/metrics` endpoint (`OTEL_METRICS_EXPORTER=prometheus`)",
        "a host name or IP address",
    ),
    Setting(
        "OTEL_EXPORTER_PROMETHEUS_HOST",
        "otel_prometheus_host",
        _text,
        None,
        "the SDK's name for the same (ours wins)",
        "a host name or IP address",
    ),
    Setting(
        env.OTEL_TUNIX_PROMETHEUS_PORT,
        "prometheus_port",
        _port,
        None,
        "port of the `/metrics` endpoint (`0`: a free port)",
        "a port number 0-65535",
    ),
    Setting(
        "OTEL_EXPORTER_PROMETHEUS_PORT",
        "otel_prometheus_port",
        _port,
        None,
        "the SDK's name for the same (ours wins)",
        "a port number 0-65535",
    ),
    Setting(
        "DATADOG_ENABLED", "datadog_enabled", parse_bool, False, "send metrics to DogStatsD", _BOOL
    ),
    Setting(
        "OTEL_SDK_DISABLED",
        "sdk_disabled",
        parse_bool,
        False,
        "the API keeps working and nothing is recorded or written",
        _BOOL,
    ),
    Setting(
        "OTEL_TRACES_EXPORTER",
        "traces_exporter",
        _names,
        None,
        "span exporters (`otlp`, `console`, `perfetto`, any installed entry point; "
        "unset: `otlp` if an OTLP endpoint is set, else none)",
        _EXPORTERS,
    ),
    Setting(
        "OTEL_METRICS_EXPORTER",
        "metrics_exporter",
        _names,
        None,
        "metric exporters (`otlp`, `prometheus`, `datadog`, `console`, ...; unset: "
        "`otlp` if an OTLP endpoint is set, else none)",
        _EXPORTERS,
    ),
    Setting(
        "OTEL_LOGS_EXPORTER",
        "logs_exporter",
        _names,
        None,
        "where alert log records go (`otlp`, `console`; unset: `otlp` if an OTLP "
        "endpoint is set, else they stay in process)",
        _EXPORTERS,
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "otlp_endpoint",
        _url,
        None,
        "OTLP endpoint of every signal (read by the OTLP exporters; its presence turns OTLP on)",
        _URL,
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "otlp_traces_endpoint",
        _url,
        None,
        "OTLP endpoint of spans",
        _URL,
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "otlp_metrics_endpoint",
        _url,
        None,
        "OTLP endpoint of metrics",
        _URL,
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
        "otlp_logs_endpoint",
        _url,
        None,
        "OTLP endpoint of log records",
        _URL,
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "otlp_protocol",
        _protocol,
        "grpc",
        "OTLP protocol of every signal",
        "grpc or http/protobuf",
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "otlp_traces_protocol",
        _protocol,
        None,
        "OTLP protocol of spans (unset: `OTEL_EXPORTER_OTLP_PROTOCOL`)",
        "grpc or http/protobuf",
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        "otlp_metrics_protocol",
        _protocol,
        None,
        "OTLP protocol of metrics (unset: `OTEL_EXPORTER_OTLP_PROTOCOL`)",
        "grpc or http/protobuf",
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
        "otlp_logs_protocol",
        _protocol,
        None,
        "OTLP protocol of log records (unset: `OTEL_EXPORTER_OTLP_PROTOCOL`)",
        "grpc or http/protobuf",
    ),
    Setting(
        "OTEL_BSP_SCHEDULE_DELAY",
        "bsp_schedule_delay_ms",
        _positive_int,
        5000,
        "batch span processor: longest wait between exports (ms)",
        "a positive integer of milliseconds",
    ),
    Setting(
        "OTEL_BSP_MAX_QUEUE_SIZE",
        "bsp_max_queue_size",
        _positive_int,
        None,
        "batch span processor: spans queued at most (a full queue drops and counts; "
        "unset: 2048, or four batches where that is more: 8192 for OTLP/HTTP's fast "
        "path)",
        "a positive integer",
    ),
    Setting(
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "bsp_max_export_batch_size",
        _positive_int,
        None,
        "batch span processor: spans per export at most (unset: 512; 2048 for OTLP/HTTP's "
        "fast path, whose requests cost per request more than per span)",
        "a positive integer",
    ),
    Setting(
        "OTEL_BSP_EXPORT_TIMEOUT",
        "bsp_export_timeout_ms",
        _positive_int,
        30000,
        "batch span processor: longest wait for one export (ms)",
        "a positive integer of milliseconds",
    ),
    Setting(
        "RANK",
        "rank",
        _non_negative_int,
        None,
        "rank of this process (`tunix.rank`; torchrun)",
        "a non-negative integer",
    ),
    Setting(
        "OMPI_COMM_WORLD_RANK",
        "ompi_rank",
        _non_negative_int,
        None,
        "rank under Open MPI",
        "a non-negative integer",
    ),
    Setting(
        "PMI_RANK",
        "pmi_rank",
        _non_negative_int,
        None,
        "rank under MPICH / Intel MPI",
        "a non-negative integer",
    ),
    Setting(
        "SLURM_PROCID",
        "slurm_procid",
        _non_negative_int,
        None,
        "rank under SLURM",
        "a non-negative integer",
    ),
    Setting(
        "WORLD_SIZE",
        "world_size",
        _positive_int,
        None,
        "processes in the job (`tunix.world_size`; torchrun)",
        "a positive integer",
    ),
    Setting(
        "OMPI_COMM_WORLD_SIZE",
        "ompi_world_size",
        _positive_int,
        None,
        "processes in the job under Open MPI",
        "a positive integer",
    ),
    Setting(
        "PMI_SIZE",
        "pmi_size",
        _positive_int,
        None,
        "processes in the job under MPICH / Intel MPI",
        "a positive integer",
    ),
    Setting(
        "SLURM_NTASKS",
        "slurm_ntasks",
        _positive_int,
        None,
        "processes in the job under SLURM",
        "a positive integer",
    ),
    Setting(
        "LOCAL_RANK",
        "local_rank",
        _non_negative_int,
        None,
        "rank on this host (`tunix.local_rank`; torchrun)",
        "a non-negative integer",
    ),
    Setting(
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "ompi_local_rank",
        _non_negative_int,
        None,
        "rank on this host under Open MPI",
        "a non-negative integer",
    ),
    Setting(
        "SLURM_LOCALID",
        "slurm_localid",
        _non_negative_int,
        None,
        "rank on this host under SLURM",
        "a non-negative integer",
    ),
    Setting(
        "TORCHELASTIC_RUN_ID",
        "torchelastic_run_id",
        _text,
        None,
        "torchrun's job id: the job id `torchelastic-<id>` shared by all ranks",
        "an id",
    ),
    Setting(
        "TORCHELASTIC_RESTART_COUNT",
        "torchelastic_restart_count",
        _text,
        None,
        "torchrun's restarts so far: the attempt is this + 1 (a value not allowed is "
        "reported and ignored)",
        "a whole number >= 0",
    ),
    Setting(
        "SLURM_JOB_ID",
        "slurm_job_id",
        _text,
        None,
        "SLURM's job id: the job id `slurm-<id>` shared by all ranks",
        "an id",
    ),
    Setting(
        "SLURM_RESTART_COUNT",
        "slurm_restart_count",
        _text,
        None,
        "times SLURM requeued the job: the attempt is this + 1 (a value not allowed is "
        "reported and ignored)",
        "a whole number >= 0",
    ),
    Setting(
        "OTEL_SERVICE_NAME",
        "",
        _text,
        None,
        "`service.name` (an explicit `service_name=` wins; unset: `unknown_service:python`)",
        "a name",
        read_by="opentelemetry-sdk",
    ),
    Setting(
        "OTEL_RESOURCE_ATTRIBUTES",
        "",
        _text,
        None,
        "more resource attributes",
        "key=value pairs",
        read_by="opentelemetry-sdk",
    ),
    *(
        Setting(
            f"OTEL_EXPORTER_OTLP{sig}{what}",
            "",
            _pem_file,
            None,
            f"{doc} of the OTLP exporter{of} (the SDK reads it when the exporter is "
            "made; `configure()` checks it first: a FIFO would block it for ever)",
            PEM,
            read_by="opentelemetry-sdk",
        )
        for sig, of in (
            ("", ""),
            ("_TRACES", " of spans"),
            ("_METRICS", " of metrics"),
            ("_LOGS", " of log records"),
        )
        for what, doc in (
            ("_CERTIFICATE", "CA certificate (PEM file) that verifies the collector"),
            ("_CLIENT_CERTIFICATE", "client certificate (PEM file), mutual TLS"),
            ("_CLIENT_KEY", "client private key (PEM file), mutual TLS"),
        )
    ),
    *DATADOG_CLIENT_SETTINGS,  # settings/datadog_settings.py
)
"""Every environment variable otel-tunix knows, in the README's order."""


def _default_text(setting: Setting) -> str:
    value = setting.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def markdown_table() -> str:
    """The README's configuration table, made from :data:`SETTINGS` (a test keeps the
    README equal to it; ``python -m otel_tunix.settings.table`` prints it)."""
    lines = [
        "| Variable | Meaning | Default | Allowed | Read by |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        lines.append(f"| `{s.name}` | {s.doc} | {_default_text(s)} | {s.allowed} | {s.read_by} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
