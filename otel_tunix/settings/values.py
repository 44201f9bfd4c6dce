"""The values of the settings table, read: :class:`Settings` and :func:`load_settings`
(``configure()`` reads every variable once per run), :func:`load_setting` (one variable, for
code that runs outside a run). The only module that reads the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from otel_tunix.settings.parsing import ConfigurationError, _pem_file
from otel_tunix.settings.redact import redact_setting
from otel_tunix.settings.table import DEFAULT_SCOPE, SETTINGS

__all__ = ["Settings", "check_sdk_files", "load_setting", "load_settings"]


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
    profile_on_alert: bool = True
    profiler: str = "auto"
    profile_steps: int = 3
    profile_max_captures: int = 3
    profile_cooldown_steps: int = 50
    job_traces: bool = True
    straggler_window: int = 50
    prometheus_run_labels: bool = True
    straggler_scope: str = "train"
    straggler_margin: float = 0.2
    straggler_windows: int = 3
    max_policy_lag: int | None = None
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


def check_sdk_files(environ: Mapping[str, str] | None = None) -> None:
    """Check the files the OTel SDK's exporters read when they are made (certificates and
    keys: ``OTEL_EXPORTER_OTLP_CERTIFICATE``, ...), so that making them cannot block on a
    FIFO or read ``/dev/zero`` until memory runs out.

    Raises:
        ConfigurationError: naming the variable and what is allowed.
    """
    source = os.environ if environ is None else environ
    for setting in SETTINGS:
        raw = source.get(setting.name) if setting.parse is _pem_file else None
        if raw is None or not raw.strip():
            continue
        try:
            _pem_file(raw.strip())
        except ValueError as exc:
            raise ConfigurationError(
                f"{setting.name}={raw!r} is not allowed ({exc}); use {setting.allowed}"
            ) from None


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


_BY_NAME: Final = {s.name: s for s in SETTINGS if s.field}


def _check_table() -> None:
    """The table and :class:`Settings` name the same fields with the same defaults."""
    declared = {f.name: f.default for f in fields(Settings)}
    table = {s.field: s.default for s in SETTINGS if s.field}
    if declared != table:  # pragma: no cover - a programming error caught at import
        raise AssertionError(f"SETTINGS and Settings differ: {declared.keys() ^ table.keys()}")


_check_table()
