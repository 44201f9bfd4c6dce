"""Every environment variable otel-tunix reads, in one table, read in one place.

:data:`SETTINGS` lists each variable with its type, default, documentation and parser;
:func:`load_settings` reads them all into a frozen :class:`Settings` (``configure()`` does it
once per run and hands the values to what it builds). A value that does not parse is a
:class:`ConfigurationError` naming the variable and what is allowed. The README's
configuration table is checked against this table by the test suite.

Variables the OpenTelemetry SDK and its exporters read themselves (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS``, ...) and those the ``datadog``
client reads (``DD_AGENT_HOST``, ``DD_ENV``, ...) are listed with ``read_by`` naming the
reader: documented here, parsed there.

The shape follows Logfire's ``config_params.py``: one table, loaded and cast in one place.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from otel_tunix import environment_variables as env
from otel_tunix._redact import redact_setting

__all__ = [
    "SETTINGS",
    "ConfigurationError",
    "Setting",
    "Settings",
    "load_setting",
    "load_settings",
    "markdown_table",
]


class ConfigurationError(ValueError):
    """A configuration value is not allowed; the message names the field and what is."""


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_OFF = frozenset({"none", "off", "false", "0"})
MAX_INTERVAL_MS: Final = 60_000.0
"""Largest allowed ``OTEL_TUNIX_PROCESS_INTERVAL_MS``."""
MAX_SHUTDOWN_SEC: Final = 3600.0
"""Largest allowed ``OTEL_TUNIX_SHUTDOWN_TIMEOUT``."""


# --- parsers: text (stripped, non-empty) -> value; ValueError when not allowed ------------


def parse_bool(raw: str) -> bool:
    value = raw.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError
    return value


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError
    return value


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError
    return value


def _text(raw: str) -> str:
    return raw


def _names(raw: str) -> tuple[str, ...]:
    """A comma-separated list of exporter names, lower-cased; ``none`` means none."""
    names = tuple(n.strip().lower() for n in raw.split(",") if n.strip())
    return () if "none" in names else names


def _components(raw: str) -> tuple[str, ...] | None:
    return tuple(c.strip() for c in raw.split(",") if c.strip()) or None


def parse_interval_ms(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= MAX_INTERVAL_MS:
        raise ValueError
    return value


def _seconds(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= MAX_SHUTDOWN_SEC:
        raise ValueError
    return value


def _seconds_or_off(raw: str) -> float | None:
    if raw.lower() in _OFF:
        return None
    value = float(raw)
    if not value > 0:
        raise ValueError
    return value


def _url(raw: str) -> str:
    """A URL with its scheme and host: ``localhost:4317`` alone would be read as the scheme
    ``localhost`` (and gRPC would then go over TLS and fail)."""
    parsed = urllib.parse.urlsplit(raw)
    if parsed.scheme.lower() not in ("http", "https") or not parsed.hostname:
        raise ValueError
    parsed.port  # noqa: B018 - raises ValueError for a port that is not a number 0-65535
    return raw


def _protocol(raw: str) -> str:
    if raw not in ("grpc", "http/protobuf"):
        raise ValueError
    return raw


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable: its name, the :class:`Settings` field it fills, how it
    parses, its default, what it means, and what values are allowed (for errors and docs)."""

    name: str
    field: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    allowed: str
    read_by: str = "otel-tunix"
    """Who parses it: ``otel-tunix`` (into :class:`Settings`), else the package named, which
    reads it itself (the row documents it)."""


_BOOL = "true or false (also 1/0, yes/no, on/off)"
_EXPORTERS = "a comma-separated list of exporter names, or none"
_URL = "a URL with its scheme (`http://host:4317`, `https://host:4318`)"

DEFAULT_SCOPE = "otel_tunix"
"""The default instrumentation scope (tracer and meter name) of otel-tunix's spans and
metrics: not ``tunix``, the meter name of upstream Tunix's own OpenTelemetry metrics."""

SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(env.OTEL_TUNIX_ENABLED, "enabled", parse_bool, True,
            "record step and component spans", _BOOL),
    Setting(env.OTEL_TUNIX_SAMPLING_RATE, "sampling_rate", _positive_int, 1,
            "record steps whose number is divisible by N",
            "a positive integer (1 = every step, N = every N-th step)"),
    Setting(env.OTEL_TUNIX_COMPONENTS, "components", _components, None,
            "comma-separated component names to record (unset: all)",
            "comma-separated component names"),
    Setting(env.OTEL_TUNIX_SCOPE, "scope", _text, DEFAULT_SCOPE,
            "instrumentation scope (tracer and meter name)", "a non-empty name"),
    Setting(env.OTEL_TUNIX_OUTPUT_DIR, "output_dir", _text, None,
            "local run folder; `none` turns it off (unset: `./otel-tunix-runs/<run id>`); "
            "a later run given a folder an earlier run wrote goes to `<folder>/run-2`, ...",
            "a directory path or none"),
    Setting(env.OTEL_TUNIX_EXPORT_JSONL_PATH, "export_jsonl_path", _text, None,
            "extra spans JSONL file (`.gz` writes gzip)", "a file path"),
    Setting(env.OTEL_TUNIX_EXPORT_FN, "export_fn", _text, None,
            "custom export function `pkg.mod:fn`", "an import path 'pkg.module:function'"),
    Setting(env.OTEL_TUNIX_RUN_ID, "run_id", _text, None,
            "run id (`tunix.run.id`; unset: the job id for a job's first attempt, "
            "`<job id>-attempt<n>` for a later one, else a new id)",
            "a non-empty id"),
    Setting(env.OTEL_TUNIX_JOB_ID, "job_id", _text, None,
            "job id (`tunix.job.id`): the runs that share it are attempts of one job "
            "(unset: `tunix.job.id` of `OTEL_RESOURCE_ATTRIBUTES`, else the launcher's, "
            "else the run id)", "a non-empty id"),
    Setting(env.OTEL_TUNIX_JOB_ATTEMPT, "job_attempt", _text, None,
            "which attempt of its job the run is (`tunix.job.attempt`; unset: "
            "`tunix.job.attempt` of `OTEL_RESOURCE_ATTRIBUTES`, else the launcher's "
            "restart count + 1, else one more than the job's runs found in the local run "
            "folders, else 1); a value not allowed is reported and ignored",
            "a whole number >= 1"),
    Setting(env.OTEL_TUNIX_LOG_ALL_RANKS, "log_all_ranks", parse_bool, False,
            "every rank's MetricsLogger logs scalars (default: rank 0 only)", _BOOL),
    Setting(env.OTEL_TUNIX_QUIET, "quiet", parse_bool, False,
            "no notes on stderr at `configure()` (run folder, destinations, sampling) and "
            "`shutdown()` (steps, anything dropped, what to run next); rank 0 prints them",
            _BOOL),
    Setting(env.OTEL_TUNIX_CONSOLE_INTERVAL, "console_interval", _seconds_or_off, None,
            "print a live line on stderr every N seconds (step, loss, tokens/s, step time, "
            "busy / blocked / idle %; rank 0, from a background thread); unset: none",
            "a number of seconds > 0, or 0 / none"),
    Setting(env.OTEL_TUNIX_PERFETTO_DIR, "perfetto_dir", _text, None,
            "stream a Perfetto trace into this directory during the run; `none` turns "
            "Perfetto off (unset: the run folder gets `trace.pftrace` at shutdown)",
            "a directory path or none"),
    Setting(env.OTEL_TUNIX_PROCESS_INTERVAL_MS, "process_interval_ms", parse_interval_ms,
            250.0,
            "longest wait before finished steps are processed off the training thread and "
            "the local files flushed (a hard kill loses at most about this much)",
            f"a number of milliseconds in (0, {MAX_INTERVAL_MS:g}]"),
    Setting(env.OTEL_TUNIX_SHUTDOWN_TIMEOUT, "shutdown_timeout", _seconds, 5.0,
            "longest time `shutdown()` takes (also at exit and on SIGTERM), whatever the "
            "collector does: local files first, then the exporters; what they could not send "
            "is counted in `summary.json`",
            f"a number of seconds in (0, {MAX_SHUTDOWN_SEC:g}]"),
    Setting(env.OTEL_TUNIX_RESOURCE_CONFIG_KEYS, "resource_config_keys", _components, None,
            "run config keys (`configure(run_config=)`; dotted for nested ones, `fnmatch` "
            "patterns, `*` for all) also put on the OTel resource as `tunix.config.<key>`; "
            "unset: none (the config stays in `config.json`); secret-looking keys are "
            "redacted whatever this says",
            "comma-separated keys or patterns"),
    Setting(env.OTEL_TUNIX_MAX_METRIC_NAMES, "max_metric_names", _positive_int, 2000,
            "distinct names a MetricsLogger accepts; values of names past it are refused, "
            "counted in `summary.json` (each name holds an OTel instrument for the run)",
            "a positive integer"),
    Setting(env.OTEL_TUNIX_ALERTS, "alerts", parse_bool, True,
            "evaluate the default alert rules on logged metrics", _BOOL),
    Setting(env.OTEL_TUNIX_JOB_TRACES, "job_traces", parse_bool, True,
            "with several ranks: step n of a scope is one trace on every rank (ids derived "
            "from the run id), each rank's step span under a `<scope>_job_step` root that "
            "rank 0 exports", _BOOL),
    Setting(env.OTEL_TUNIX_STRAGGLER_WINDOW, "straggler_window", _non_negative_int, 50,
            "with several ranks under `torch.distributed` or `jax.distributed`: every this "
            "many sampled steps of "
            "the straggler scope the ranks compare their mean own times (step time minus "
            "blocked time; off the training thread, over the job's store); `0` turns it off",
            "a whole number >= 0"),
    Setting(env.OTEL_TUNIX_STRAGGLER_SCOPE, "straggler_scope", _text, "train",
            "the scope whose steps the ranks compare", "a scope name"),
    Setting(env.OTEL_TUNIX_STRAGGLER_MARGIN, "straggler_margin", _positive_float, 0.2,
            "how much slower than the ranks' median own time a rank is slow in a window "
            "(`0.2`: 20 %)", "a number > 0"),
    Setting(env.OTEL_TUNIX_STRAGGLER_WINDOWS, "straggler_windows", _positive_int, 3,
            "windows in a row a rank is slow before the `straggler` alert fires",
            "a whole number >= 1"),
    Setting(env.OTEL_TUNIX_SYSTEM_METRICS_INTERVAL, "system_metrics_interval",
            _seconds_or_off, 10.0,
            "seconds between GPU / process / host samples; `0` or `none` turns it off",
            "a number of seconds > 0, or 0 / none"),
    Setting(env.OTEL_TUNIX_RAISE_INTERNAL_ERRORS, "raise_internal_errors", parse_bool, False,
            "re-raise otel-tunix's internal errors instead of reporting them once "
            "(the test suite sets it)", _BOOL),
    Setting(env.OTEL_TUNIX_OTLP_FAST_PATH, "otlp_fast_path", parse_bool, True,
            "encode spans for the OTLP exporter from the steps directly (same bytes, ~10x "
            "less CPU); `false`: the SDK's OTLP span exporter as it is", _BOOL),
    Setting(env.OTEL_TUNIX_METRICS_FAST_PATH, "metrics_fast_path", parse_bool, True,
            "aggregate the step and component histograms per batch of steps and hand the "
            "readers finished points (same points, ~20x less CPU); `false`: the SDK's "
            "instruments, one call per value", _BOOL),
    Setting(env.OTEL_TUNIX_PROMETHEUS_RUN_LABELS, "prometheus_run_labels", parse_bool, True,
            "label every series of the `/metrics` endpoint with `service` and `run_id`, so "
            "one Prometheus scraping several jobs tells them apart without a join on "
            "`target_info`", _BOOL),
    Setting(env.OTEL_TUNIX_PROMETHEUS_HOST, "prometheus_host", _text, None,
            "host of the `/metrics` endpoint (`OTEL_METRICS_EXPORTER=prometheus`)",
            "a host name or IP address"),
    Setting("OTEL_EXPORTER_PROMETHEUS_HOST", "otel_prometheus_host", _text, None,
            "the SDK's name for the same (ours wins)", "a host name or IP address"),
    Setting(env.OTEL_TUNIX_PROMETHEUS_PORT, "prometheus_port", _port, None,
            "port of the `/metrics` endpoint (`0`: a free port)", "a port number 0-65535"),
    Setting("OTEL_EXPORTER_PROMETHEUS_PORT", "otel_prometheus_port", _port, None,
            "the SDK's name for the same (ours wins)", "a port number 0-65535"),
    Setting("DATADOG_ENABLED", "datadog_enabled", parse_bool, False,
            "send metrics to DogStatsD", _BOOL),
    Setting("OTEL_SDK_DISABLED", "sdk_disabled", parse_bool, False,
            "the API keeps working and nothing is recorded or written", _BOOL),
    Setting("OTEL_TRACES_EXPORTER", "traces_exporter", _names, None,
            "span exporters (`otlp`, `console`, `perfetto`, any installed entry point; "
            "unset: `otlp` if an OTLP endpoint is set, else none)", _EXPORTERS),
    Setting("OTEL_METRICS_EXPORTER", "metrics_exporter", _names, None,
            "metric exporters (`otlp`, `prometheus`, `datadog`, `console`, ...; unset: "
            "`otlp` if an OTLP endpoint is set, else none)", _EXPORTERS),
    Setting("OTEL_LOGS_EXPORTER", "logs_exporter", _names, None,
            "where alert log records go (`otlp`, `console`; unset: `otlp` if an OTLP "
            "endpoint is set, else they stay in process)", _EXPORTERS),
    Setting("OTEL_EXPORTER_OTLP_ENDPOINT", "otlp_endpoint", _url, None,
            "OTLP endpoint of every signal (read by the OTLP exporters; its presence "
            "turns OTLP on)", _URL),
    Setting("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "otlp_traces_endpoint", _url, None,
            "OTLP endpoint of spans", _URL),
    Setting("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "otlp_metrics_endpoint", _url, None,
            "OTLP endpoint of metrics", _URL),
    Setting("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "otlp_logs_endpoint", _url, None,
            "OTLP endpoint of log records", _URL),
    Setting("OTEL_EXPORTER_OTLP_PROTOCOL", "otlp_protocol", _protocol, "grpc",
            "OTLP protocol of every signal", "grpc or http/protobuf"),
    Setting("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "otlp_traces_protocol", _protocol, None,
            "OTLP protocol of spans (unset: `OTEL_EXPORTER_OTLP_PROTOCOL`)",
            "grpc or http/protobuf"),
    Setting("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "otlp_metrics_protocol", _protocol, None,
            "OTLP protocol of metrics (unset: `OTEL_EXPORTER_OTLP_PROTOCOL`)",
            "grpc or http/protobuf"),
    Setting("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "otlp_logs_protocol", _protocol, None,
            "OTLP protocol of log records (unset: `OTEL_EXPORTER_OTLP_PROTOCOL`)",
            "grpc or http/protobuf"),
    Setting("OTEL_BSP_SCHEDULE_DELAY", "bsp_schedule_delay_ms", _positive_int, 5000,
            "batch span processor: longest wait between exports (ms)",
            "a positive integer of milliseconds"),
    Setting("OTEL_BSP_MAX_QUEUE_SIZE", "bsp_max_queue_size", _positive_int, None,
            "batch span processor: spans queued at most (a full queue drops and counts; "
            "unset: 2048, or four batches where that is more: 8192 for OTLP/HTTP's fast "
            "path)", "a positive integer"),
    Setting("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "bsp_max_export_batch_size", _positive_int, None,
            "batch span processor: spans per export at most (unset: 512; 2048 for OTLP/HTTP's "
            "fast path, whose requests cost per request more than per span)",
            "a positive integer"),
    Setting("OTEL_BSP_EXPORT_TIMEOUT", "bsp_export_timeout_ms", _positive_int, 30000,
            "batch span processor: longest wait for one export (ms)",
            "a positive integer of milliseconds"),
    Setting("RANK", "rank", _non_negative_int, None,
            "rank of this process (`tunix.rank`; torchrun)", "a non-negative integer"),
    Setting("OMPI_COMM_WORLD_RANK", "ompi_rank", _non_negative_int, None,
            "rank under Open MPI", "a non-negative integer"),
    Setting("PMI_RANK", "pmi_rank", _non_negative_int, None,
            "rank under MPICH / Intel MPI", "a non-negative integer"),
    Setting("SLURM_PROCID", "slurm_procid", _non_negative_int, None,
            "rank under SLURM", "a non-negative integer"),
    Setting("WORLD_SIZE", "world_size", _positive_int, None,
            "processes in the job (`tunix.world_size`; torchrun)", "a positive integer"),
    Setting("OMPI_COMM_WORLD_SIZE", "ompi_world_size", _positive_int, None,
            "processes in the job under Open MPI", "a positive integer"),
    Setting("PMI_SIZE", "pmi_size", _positive_int, None,
            "processes in the job under MPICH / Intel MPI", "a positive integer"),
    Setting("SLURM_NTASKS", "slurm_ntasks", _positive_int, None,
            "processes in the job under SLURM", "a positive integer"),
    Setting("LOCAL_RANK", "local_rank", _non_negative_int, None,
            "rank on this host (`tunix.local_rank`; torchrun)", "a non-negative integer"),
    Setting("OMPI_COMM_WORLD_LOCAL_RANK", "ompi_local_rank", _non_negative_int, None,
            "rank on this host under Open MPI", "a non-negative integer"),
    Setting("SLURM_LOCALID", "slurm_localid", _non_negative_int, None,
            "rank on this host under SLURM", "a non-negative integer"),
    Setting("TORCHELASTIC_RUN_ID", "torchelastic_run_id", _text, None,
            "torchrun's job id: the job id `torchelastic-<id>` shared by all ranks",
            "an id"),
    Setting("TORCHELASTIC_RESTART_COUNT", "torchelastic_restart_count", _text, None,
            "torchrun's restarts so far: the attempt is this + 1 (a value not allowed is "
            "reported and ignored)", "a whole number >= 0"),
    Setting("SLURM_JOB_ID", "slurm_job_id", _text, None,
            "SLURM's job id: the job id `slurm-<id>` shared by all ranks", "an id"),
    Setting("SLURM_RESTART_COUNT", "slurm_restart_count", _text, None,
            "times SLURM requeued the job: the attempt is this + 1 (a value not allowed is "
            "reported and ignored)", "a whole number >= 0"),
    Setting("OTEL_SERVICE_NAME", "", _text, None,
            "`service.name` (an explicit `service_name=` wins; unset: "
            "`unknown_service:python`)", "a name",
            read_by="opentelemetry-sdk"),
    Setting("OTEL_RESOURCE_ATTRIBUTES", "", _text, None,
            "more resource attributes", "key=value pairs", read_by="opentelemetry-sdk"),
    Setting("DD_AGENT_HOST", "", _text, None, "DogStatsD host", "a host name",
            read_by="datadog"),
    Setting("DD_DOGSTATSD_PORT", "", _text, None, "DogStatsD port", "a port",
            read_by="datadog"),
    Setting("DD_DOGSTATSD_URL", "", _text, None,
            "DogStatsD address (`udp://host:port`, `unix:///path`)", "a URL",
            read_by="datadog"),
    Setting("DD_ENV", "", _text, None, "the `env` tag", "a name", read_by="datadog"),
    Setting("DD_SERVICE", "", _text, None, "the `service` tag", "a name", read_by="datadog"),
    Setting("DD_VERSION", "", _text, None, "the `version` tag", "a version",
            read_by="datadog"),
)  # fmt: skip
"""Every environment variable otel-tunix knows, in the README's order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """The values of :data:`SETTINGS` (each field's meaning is its row's ``doc``)."""

    enabled: bool = True
    sampling_rate: int = 1
    components: tuple[str, ...] | None = None
    scope: str = DEFAULT_SCOPE
    output_dir: str | None = None
    export_jsonl_path: str | None = None
    export_fn: str | None = None
    run_id: str | None = None
    job_id: str | None = None
    job_attempt: str | None = None
    log_all_ranks: bool = False
    quiet: bool = False
    console_interval: float | None = None
    perfetto_dir: str | None = None
    process_interval_ms: float = 250.0
    shutdown_timeout: float = 5.0
    resource_config_keys: tuple[str, ...] | None = None
    max_metric_names: int = 2000
    alerts: bool = True
    job_traces: bool = True
    straggler_window: int = 50
    prometheus_run_labels: bool = True
    straggler_scope: str = "train"
    straggler_margin: float = 0.2
    straggler_windows: int = 3
    system_metrics_interval: float | None = 10.0
    raise_internal_errors: bool = False
    otlp_fast_path: bool = True
    metrics_fast_path: bool = True
    prometheus_host: str | None = None
    otel_prometheus_host: str | None = None
    prometheus_port: int | None = None
    otel_prometheus_port: int | None = None
    datadog_enabled: bool = False
    sdk_disabled: bool = False
    traces_exporter: tuple[str, ...] | None = None
    metrics_exporter: tuple[str, ...] | None = None
    logs_exporter: tuple[str, ...] | None = None
    otlp_endpoint: str | None = None
    otlp_traces_endpoint: str | None = None
    otlp_metrics_endpoint: str | None = None
    otlp_logs_endpoint: str | None = None
    otlp_protocol: str = "grpc"
    otlp_traces_protocol: str | None = None
    otlp_metrics_protocol: str | None = None
    otlp_logs_protocol: str | None = None
    bsp_schedule_delay_ms: int = 5000
    bsp_max_queue_size: int | None = None
    bsp_max_export_batch_size: int | None = None
    bsp_export_timeout_ms: int = 30000
    rank: int | None = None
    ompi_rank: int | None = None
    pmi_rank: int | None = None
    slurm_procid: int | None = None
    world_size: int | None = None
    ompi_world_size: int | None = None
    pmi_size: int | None = None
    slurm_ntasks: int | None = None
    local_rank: int | None = None
    ompi_local_rank: int | None = None
    slurm_localid: int | None = None
    torchelastic_run_id: str | None = None
    torchelastic_restart_count: str | None = None
    slurm_job_id: str | None = None
    slurm_restart_count: str | None = None

    # --- values several readers combine -------------------------------------------------

    @property
    def launcher_rank(self) -> int | None:
        """The rank a launcher gave (torchrun, MPI, SLURM, in that order), else ``None``."""
        return _first(self.rank, self.ompi_rank, self.pmi_rank, self.slurm_procid)

    @property
    def launcher_world_size(self) -> int | None:
        return _first(self.world_size, self.ompi_world_size, self.pmi_size, self.slurm_ntasks)

    @property
    def launcher_local_rank(self) -> int | None:
        return _first(self.local_rank, self.ompi_local_rank, self.slurm_localid)

    @property
    def datadog_wanted(self) -> bool:
        """Metrics to Datadog: ``DATADOG_ENABLED``, or ``OTEL_METRICS_EXPORTER`` names it."""
        return self.datadog_enabled or "datadog" in (self.metrics_exporter or ())

    def exporters(self, signal: str) -> tuple[str, ...]:
        """The exporter names of ``signal`` (``traces``, ``metrics`` or ``logs``): its
        ``OTEL_<SIGNAL>_EXPORTER`` list, or ``otlp`` when that is unset and an OTLP endpoint
        of the signal is set, else none."""
        names: tuple[str, ...] | None = getattr(self, f"{signal}_exporter")
        if names is not None:
            return names
        endpoint = self.otlp_endpoint or getattr(self, f"otlp_{signal}_endpoint")
        return ("otlp",) if endpoint else ()

    def otlp_protocol_of(self, signal: str) -> str:
        """The OTLP protocol of ``signal``: its own variable, else the shared one."""
        own: str | None = getattr(self, f"otlp_{signal}_protocol")
        return own or self.otlp_protocol


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read every variable of :data:`SETTINGS` from ``environ`` (default ``os.environ``).

    Unset or blank variables take the default.

    Raises:
        ConfigurationError: a value does not parse; the message names the variable and
            what is allowed.
    """
    source = os.environ if environ is None else environ
    return Settings(**{s.field: load_setting(s.name, source) for s in SETTINGS if s.field})


def load_setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of the one variable ``name`` of :data:`SETTINGS` (for code that runs
    outside a run, like the internal-error policy; everything else reads
    :func:`load_settings` once)."""
    setting = _BY_NAME[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return setting.default
    try:
        return setting.parse(raw.strip())
    except ValueError:
        shown = redact_setting(name, raw)  # an endpoint's credentials, a header's value
        raise ConfigurationError(
            f"{name}={shown!r} is not allowed; use {setting.allowed}"
        ) from None


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
    README equal to it; ``python -m otel_tunix.settings`` prints it)."""
    lines = [
        "| Variable | Meaning | Default | Allowed | Read by |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        lines.append(f"| `{s.name}` | {s.doc} | {_default_text(s)} | {s.allowed} | {s.read_by} |")
    return "\n".join(lines) + "\n"


_BY_NAME: Final = {s.name: s for s in SETTINGS if s.field}


def _check_table() -> None:
    """The table and :class:`Settings` name the same fields with the same defaults."""
    declared = {f.name: f.default for f in fields(Settings)}
    table = {s.field: s.default for s in SETTINGS if s.field}
    if declared != table:  # pragma: no cover - a programming error caught at import
        raise AssertionError(f"SETTINGS and Settings differ: {declared.keys() ^ table.keys()}")


_check_table()

if __name__ == "__main__":
    print(markdown_table(), end="")
