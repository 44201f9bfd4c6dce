"""GPU and system metrics, sampled on a background thread.

:class:`SystemMetricsSampler` reads, every ``interval_sec`` on its own daemon thread:

* **NVML** (``nvidia-ml-py``, ``pip install 'otel-tunix[gpu]'``), per GPU: utilization,
  memory used / total, power, energy, temperature, SM clock -> ``hw.gpu.utilization``,
  ``hw.gpu.memory.usage`` / ``.limit`` / ``.utilization``, ``hw.power``, ``hw.energy``,
  ``hw.temperature`` (semantic conventions, ``hw.type=gpu``, ``hw.id`` = the GPU's UUID) and
  ``tunix.gpu.clock.sm``. Without the package, a driver or a GPU this part is off and costs
  nothing (one debug line says why). A query a GPU does not support is dropped for it.
* **psutil** (``pip install 'otel-tunix[system]'``): process CPU time and utilization, RSS,
  host memory -> ``process.cpu.time``, ``process.cpu.utilization``,
  ``process.memory.usage``, ``system.memory.usage`` / ``.limit`` / ``.utilization``.
* **Framework memory** (``framework=True``; off by default because the torch and JAX
  instrumentations already publish the same ``tunix.memory.*`` gauges once per step), only
  for frameworks the program already imported: torch (``memory_allocated`` /
  ``memory_reserved`` / ``max_memory_allocated`` of every CUDA device, once CUDA is
  initialized; the peak is not reset) and JAX (``Device.memory_stats()``) ->
  ``tunix.memory.{allocated,reserved,peak_allocated,limit}`` with ``framework`` and
  ``device``. Use it for loops that run without those instrumentations.
* **Queues** registered with :func:`instrument_queue` -> ``tunix.queue.depth{queue=...}``.

The OTel instruments are observable: the metric reader's collection reads the latest
sample, never NVML or psutil, so an export costs nothing extra and the training thread is
never involved. :attr:`SystemMetricsSampler.latest` gives the same sample in process.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from otel_tunix.logger import status
from otel_tunix.logger.instruments import CatalogInstruments, create_observable
from otel_tunix.model.catalog import by_otel_name
from otel_tunix.support.errors import report_internal_error, warn_once

__all__ = [
    "DeviceMemoryReading",
    "GpuReading",
    "HostReading",
    "ProcessReading",
    "SystemMetricsSampler",
    "SystemSample",
    "instrument_queue",
    "uninstrument_queue",
]

_logger = logging.getLogger(__name__)

_queues: dict[str, Callable[[], Any]] = {}
_queues_lock = threading.Lock()


def instrument_queue(q: Any, name: str) -> None:
    """Report ``q.qsize()`` as ``tunix.queue.depth{queue=name}`` in every sample.

    Held by a weak reference where the queue allows one: a dropped queue stops reporting.
    Works with ``queue.Queue``, ``asyncio.Queue``, ``multiprocessing.Queue`` (where
    ``qsize`` works) and anything with ``qsize()``.
    """
    try:
        ref: Callable[[], Any] = weakref.ref(q)
    except TypeError:
        ref = lambda: q  # noqa: E731 - objects without weakref support are held strongly
    with _queues_lock:
        _queues[name] = ref


def uninstrument_queue(name: str) -> None:
    """Stop reporting the queue registered as ``name``."""
    with _queues_lock:
        _queues.pop(name, None)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one instant, in SI units; a field is ``None`` when NVML has no answer."""

    index: int
    uuid: str
    name: str
    utilization: float | None = None
    """Fraction of the last sample period with a kernel running (0..1)."""
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hz: float | None = None

    @property
    def memory_utilization(self) -> float | None:
        """``memory_used_bytes / memory_total_bytes``."""
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes

    def attributes(self, driver_version: str | None = None) -> dict[str, str]:
        """Semantic-convention ``hw.*`` attributes of this GPU."""
        a = {
            "hw.id": self.uuid or f"gpu{self.index}",
            "hw.type": "gpu",
            "hw.name": f"gpu{self.index}",
            "hw.vendor": "NVIDIA",
            "hw.model": self.name,
        }
        if driver_version:
            a["hw.driver_version"] = driver_version
        return a


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """This process: CPU seconds by mode, CPU utilization since the last sample, RSS."""

    cpu_user_sec: float
    cpu_system_sec: float
    cpu_utilization: float | None
    rss_bytes: int


@dataclass(frozen=True, slots=True)
class HostReading:
    """Host memory: total and in use (total minus available)."""

    memory_total_bytes: int
    memory_used_bytes: int


@dataclass(frozen=True, slots=True)
class DeviceMemoryReading:
    """A framework's view of one device's memory (``None``: not reported)."""

    framework: str
    device: str
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    peak_bytes: int | None = None
    limit_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class SystemSample:
    """Everything read at one instant (``time.time()`` in ``time``)."""

    time: float
    gpus: tuple[GpuReading, ...] = ()
    process: ProcessReading | None = None
    host: HostReading | None = None
    device_memory: tuple[DeviceMemoryReading, ...] = ()
    queues: dict[str, int] = field(default_factory=dict)


class _Nvml:
    """NVML handles and the queries each GPU supports (unsupported ones are not retried)."""

    def __init__(self, indices: Sequence[int] | None) -> None:
        self.ok = False
        self.driver_version: str | None = None
        self._handles: list[tuple[int, Any, str, str]] = []
        self._unsupported: set[tuple[int, str]] = set()
        try:
            import pynvml
        except ImportError:
            _logger.debug(
                "otel-tunix: no GPU metrics: nvidia-ml-py is not installed "
                "(pip install 'otel-tunix[gpu]')"
            )
            return
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            _logger.debug("otel-tunix: no GPU metrics: NVML did not start (%s)", exc)
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
            self.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
            for i in range(count) if indices is None else indices:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                self._handles.append(
                    (i, h, _text(pynvml.nvmlDeviceGetUUID(h)), _text(pynvml.nvmlDeviceGetName(h)))
                )
        except Exception as exc:
            _logger.warning("otel-tunix: NVML could not list the GPUs (%s); no GPU metrics", exc)
            self._handles = []
        if not self._handles:
            pynvml.nvmlShutdown()
            _logger.debug("otel-tunix: no GPU metrics: NVML found no GPU")
            return
        self.ok = True

    def _query(self, index: int, handle: Any, what: str, fn: Callable[[Any], Any]) -> Any:
        if (index, what) in self._unsupported:
            return None
        try:
            return fn(handle)
        except Exception:
            self._unsupported.add((index, what))
            _logger.debug("otel-tunix: NVML %s not available on GPU %d", what, index)
            return None

    def read(self) -> tuple[GpuReading, ...]:
        nv, q = self._nv, self._query
        gpu_sensor, sm_clock = nv.NVML_TEMPERATURE_GPU, nv.NVML_CLOCK_SM

        def util_of(h: Any) -> Any:
            return nv.nvmlDeviceGetUtilizationRates(h).gpu

        def temp_of(h: Any) -> Any:
            return nv.nvmlDeviceGetTemperature(h, gpu_sensor)

        def sm_of(h: Any) -> Any:
            return nv.nvmlDeviceGetClockInfo(h, sm_clock)

        out = []
        for i, h, uuid, name in self._handles:
            util = q(i, h, "utilization", util_of)
            mem = q(i, h, "memory", nv.nvmlDeviceGetMemoryInfo)
            power = q(i, h, "power", nv.nvmlDeviceGetPowerUsage)  # mW
            energy = q(i, h, "energy", nv.nvmlDeviceGetTotalEnergyConsumption)  # mJ
            temp = q(i, h, "temperature", temp_of)  # °C
            sm = q(i, h, "sm_clock", sm_of)  # MHz
            out.append(
                GpuReading(
                    index=i,
                    uuid=uuid,
                    name=name,
                    utilization=None if util is None else util / 100.0,
                    memory_used_bytes=None if mem is None else int(mem.used),
                    memory_total_bytes=None if mem is None else int(mem.total),
                    power_watts=None if power is None else power / 1000.0,
                    energy_joules=None if energy is None else energy / 1000.0,
                    temperature_celsius=None if temp is None else float(temp),
                    sm_clock_hz=None if sm is None else sm * 1e6,
                )
            )
        return tuple(out)

    def close(self) -> None:
        if self.ok:
            self.ok = False
            try:
                self._nv.nvmlShutdown()
            except Exception:  # pragma: no cover - driver specific; closing: nothing left to do
                pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _framework_memory() -> tuple[DeviceMemoryReading, ...]:
    out: list[DeviceMemoryReading] = []
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                for i in range(torch.cuda.device_count()):
                    out.append(
                        DeviceMemoryReading(
                            "torch",
                            f"cuda:{i}",
                            allocated_bytes=int(torch.cuda.memory_allocated(i)),
                            reserved_bytes=int(torch.cuda.memory_reserved(i)),
                            peak_bytes=int(torch.cuda.max_memory_allocated(i)),
                        )
                    )
        except Exception:  # torch or its driver
            warn_once(
                ("system", "torch-memory"),
                "otel-tunix: torch memory stats failed (reported once)",
                logger=_logger,
                level=logging.DEBUG,
                exc_info=True,
            )
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            for d in jax.local_devices():
                stats = d.memory_stats() if hasattr(d, "memory_stats") else None
                if not stats:
                    continue
                out.append(
                    DeviceMemoryReading(
                        "jax",
                        f"{d.platform}:{d.id}",
                        allocated_bytes=stats.get("bytes_in_use"),
                        reserved_bytes=stats.get("bytes_reserved"),
                        peak_bytes=stats.get("peak_bytes_in_use"),
                        limit_bytes=stats.get("bytes_limit"),
                    )
                )
        except Exception:  # JAX or its backend
            warn_once(
                ("system", "jax-memory"),
                "otel-tunix: JAX memory stats failed (reported once)",
                logger=_logger,
                level=logging.DEBUG,
                exc_info=True,
            )
    return tuple(out)


def _queue_depths() -> dict[str, int]:
    out: dict[str, int] = {}
    with _queues_lock:
        items = list(_queues.items())
    for name, ref in items:
        q = ref()
        if q is None:
            uninstrument_queue(name)
            continue
        try:
            out[name] = int(q.qsize())
        except Exception:  # e.g. multiprocessing.Queue on macOS: no depth, nothing to report
            continue
    return out


class SystemMetricsSampler:
    """Samples GPU, process, host, framework-memory and queue metrics on a daemon thread.

    Args:
        meter_provider: Where the observable instruments live; default: the current run's
            MeterProvider (the global one before ``configure()``).
        interval_sec: Seconds between samples (default 10).
        gpus: Read NVML; a sequence of indices limits it to those GPUs (in a job with one
            process per GPU, pass the local rank's index so GPUs are not reported twice).
        process: Read psutil (process and host).
        framework: Read torch / JAX memory stats (only when already imported); off by
            default, the framework instrumentations publish them per step.
        instruments: Register the OTel instruments.
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        *,
        interval_sec: float = 10.0,
        gpus: bool | Sequence[int] = True,
        process: bool = True,
        framework: bool = False,
        instruments: bool = True,
    ) -> None:
        if not interval_sec > 0:
            raise ValueError(f"interval_sec must be > 0, got {interval_sec!r}")
        self.interval_sec = float(interval_sec)
        self._framework = framework
        self._nvml: _Nvml | None = None
        if gpus:
            nv = _Nvml(None if gpus is True else list(gpus))
            self._nvml = nv if nv.ok else None
        self._proc: Any = None
        self._ncpu = 1
        if process:
            try:
                import psutil
            except ImportError:
                _logger.debug("otel-tunix: no process metrics: psutil is not installed")
            else:
                self._psutil = psutil
                self._proc = psutil.Process()
                try:
                    self._ncpu = len(os.sched_getaffinity(0))
                except AttributeError:  # pragma: no cover - not Linux
                    self._ncpu = psutil.cpu_count() or 1
        self._prev_cpu: tuple[float, float] | None = None
        self._lock = threading.Lock()
        self._latest: SystemSample | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if instruments:
            self._register(CatalogInstruments(meter_provider))

    @property
    def has_gpus(self) -> bool:
        """True when NVML found at least one GPU."""
        return self._nvml is not None

    @property
    def latest(self) -> SystemSample | None:
        """The most recent sample (``None`` before the first)."""
        return self._latest

    # --- sampling -----------------------------------------------------------------------
    def sample(self) -> SystemSample:
        """Read everything now (on the calling thread) and keep it as :attr:`latest`."""
        gpus = self._nvml.read() if self._nvml is not None else ()
        proc = host = None
        if self._proc is not None:
            try:
                proc, host = self._read_process()
            except Exception:  # psutil (e.g. a /proc it cannot read)
                warn_once(
                    (id(self), "psutil"),
                    "otel-tunix: psutil read failed (reported once)",
                    logger=_logger,
                    level=logging.DEBUG,
                    exc_info=True,
                )
        s = SystemSample(
            time=time.time(),
            gpus=gpus,
            process=proc,
            host=host,
            device_memory=_framework_memory() if self._framework else (),
            queues=_queue_depths(),
        )
        with self._lock:
            self._latest = s
        return s

    def _read_process(self) -> tuple[ProcessReading, HostReading]:
        now = time.monotonic()
        ct = self._proc.cpu_times()
        cpu = float(ct.user + ct.system)
        util = None
        if self._prev_cpu is not None:
            dt = now - self._prev_cpu[0]
            if dt > 0:
                util = max(0.0, (cpu - self._prev_cpu[1]) / dt / self._ncpu)
        self._prev_cpu = (now, cpu)
        rss = int(self._proc.memory_info().rss)
        vm = self._psutil.virtual_memory()
        return (
            ProcessReading(float(ct.user), float(ct.system), util, rss),
            HostReading(int(vm.total), int(vm.total - vm.available)),
        )

    def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # what NVML, psutil and the frameworks raise is handled inside
                report_internal_error("sampling system metrics")
            if self._stop.wait(self.interval_sec):
                return

    def start(self) -> SystemMetricsSampler:
        """Start the sampling thread (idempotent); the first sample is taken at once."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="otel-tunix-system", daemon=True)
            self._thread.start()
        status.track_sampler(self)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and release NVML (idempotent)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        self._thread = None
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
        if status._sampler is self:
            status.track_sampler(None)

    def __enter__(self) -> SystemMetricsSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- OTel ---------------------------------------------------------------------------
    def _register(self, inst: CatalogInstruments) -> None:
        meter = inst.meter

        def obs(name: str, read: Callable[[SystemSample], list[Observation]]) -> None:
            def callback(_: CallbackOptions) -> list[Observation]:
                s = self._latest
                if s is None:
                    return []
                try:
                    return read(s)
                except Exception:  # reading our own sample: never break the metric reader
                    report_internal_error(f"observing {name}")
                    return []

            create_observable(meter, by_otel_name(name), callback)

        driver = self._nvml.driver_version if self._nvml is not None else None

        def gpu(
            field_fn: Callable[[GpuReading], float | int | None],
        ) -> Callable[[SystemSample], list[Observation]]:
            def read(s: SystemSample) -> list[Observation]:
                return [
                    Observation(v, g.attributes(driver))
                    for g in s.gpus
                    if (v := field_fn(g)) is not None
                ]

            return read

        if self._nvml is not None:
            obs("hw.gpu.utilization", gpu(lambda g: g.utilization))
            obs("hw.gpu.memory.usage", gpu(lambda g: g.memory_used_bytes))
            obs("hw.gpu.memory.limit", gpu(lambda g: g.memory_total_bytes))
            obs("hw.gpu.memory.utilization", gpu(lambda g: g.memory_utilization))
            obs("hw.power", gpu(lambda g: g.power_watts))
            obs("hw.energy", gpu(lambda g: g.energy_joules))
            obs("hw.temperature", gpu(lambda g: g.temperature_celsius))
            obs("tunix.gpu.clock.sm", gpu(lambda g: g.sm_clock_hz))
        if self._proc is not None:
            obs(
                "process.cpu.time",
                lambda s: (
                    [
                        Observation(s.process.cpu_user_sec, {"cpu.mode": "user"}),
                        Observation(s.process.cpu_system_sec, {"cpu.mode": "system"}),
                    ]
                    if s.process
                    else []
                ),
            )
            obs(
                "process.cpu.utilization",
                lambda s: (
                    [Observation(s.process.cpu_utilization)]
                    if s.process and s.process.cpu_utilization is not None
                    else []
                ),
            )
            obs(
                "process.memory.usage",
                lambda s: [Observation(s.process.rss_bytes)] if s.process else [],
            )
            obs(
                "system.memory.usage",
                lambda s: [Observation(s.host.memory_used_bytes)] if s.host else [],
            )
            obs(
                "system.memory.limit",
                lambda s: [Observation(s.host.memory_total_bytes)] if s.host else [],
            )
            obs(
                "system.memory.utilization",
                lambda s: (
                    [Observation(s.host.memory_used_bytes / s.host.memory_total_bytes)]
                    if s.host and s.host.memory_total_bytes
                    else []
                ),
            )

        def dev(attr_name: str) -> Callable[[SystemSample], list[Observation]]:
            def read(s: SystemSample) -> list[Observation]:
                return [
                    Observation(v, {"framework": m.framework, "device": m.device})
                    for m in s.device_memory
                    if (v := getattr(m, attr_name)) is not None
                ]

            return read

        if self._framework:
            obs("tunix.memory.allocated", dev("allocated_bytes"))
            obs("tunix.memory.reserved", dev("reserved_bytes"))
            obs("tunix.memory.peak_allocated", dev("peak_bytes"))
            obs("tunix.memory.limit", dev("limit_bytes"))
        obs(
            "tunix.queue.depth",
            lambda s: [Observation(n, {"queue": k}) for k, n in s.queues.items()],
        )
