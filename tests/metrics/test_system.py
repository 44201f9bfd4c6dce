"""System sampler on a CPU machine: the NVML-absent paths, psutil readings, queue depth.

The NVML readings themselves need a GPU: ``bench/gpu_check.py`` prints them on one.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_tunix.logger import status
from otel_tunix.metrics import system as sysm
from otel_tunix.metrics.system import GpuReading, SystemMetricsSampler, instrument_queue


def _points(reader):
    out: dict[str, tuple[str, list]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = (m.unit, list(m.data.data_points))
    return out


@pytest.fixture
def reader():
    return InMemoryMetricReader()


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


no_gpu = pytest.mark.skipif(_nvml_works(), reason="checks the path of a machine without GPU")


@no_gpu
def test_no_gpu_means_no_gpu_instruments_and_no_error(reader, caplog):
    caplog.set_level(logging.DEBUG, logger="otel_tunix.metrics.system")
    s = SystemMetricsSampler(MeterProvider(metric_readers=[reader]))
    assert not s.has_gpus
    sample = s.sample()
    assert sample.gpus == ()
    assert not any(n.startswith("hw.") for n in _points(reader))
    assert any("no GPU metrics" in r.getMessage() for r in caplog.records)
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)
    s.stop()


def test_without_nvidia_ml_py_installed(monkeypatch, reader, caplog):
    caplog.set_level(logging.DEBUG, logger="otel_tunix.metrics.system")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    s = SystemMetricsSampler(MeterProvider(metric_readers=[reader]))
    assert not s.has_gpus and s.sample().gpus == ()
    assert any("nvidia-ml-py is not installed" in r.getMessage() for r in caplog.records)


def test_process_and_host_readings(reader):
    s = SystemMetricsSampler(MeterProvider(metric_readers=[reader]))
    first = s.sample()
    assert first.process is not None and first.host is not None
    assert first.process.cpu_utilization is None  # needs two samples
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.2:  # burn CPU on this thread
        sum(range(1000))
    second = s.sample()
    assert second.process.cpu_utilization is not None
    assert 0.1 / len(os.sched_getaffinity(0)) < second.process.cpu_utilization <= 1.05
    assert second.process.rss_bytes > 10 * 2**20
    assert 0 < second.host.memory_used_bytes < second.host.memory_total_bytes
    p = _points(reader)
    assert p["process.memory.usage"][0] == "By"
    assert p["process.memory.usage"][1][0].value == second.process.rss_bytes
    assert p["process.cpu.utilization"][1][0].value == second.process.cpu_utilization
    modes = {dict(d.attributes)["cpu.mode"] for d in p["process.cpu.time"][1]}
    assert modes == {"user", "system"}
    used = p["system.memory.usage"][1][0]
    assert dict(used.attributes) == {"system.memory.state": "used"}
    assert p["system.memory.limit"][1][0].value == second.host.memory_total_bytes


def test_a_later_sampler_on_the_same_provider_reports_its_own_readings(reader):
    """The SDK hands back the first observable instrument of a name with the callbacks it
    was made with: without taking the instruments over, the first (stopped) sampler's
    readings would be reported for good."""
    mp = MeterProvider(metric_readers=[reader])
    first = SystemMetricsSampler(mp, gpus=False)
    first.sample()
    first.stop()
    second = SystemMetricsSampler(mp, gpus=False)
    second._latest = sysm.SystemSample(  # a reading the first sampler never had
        time=time.time(), gpus=(), process=sysm.ProcessReading(1.0, 2.0, 0.5, 12345),
        host=None, device_memory=(), queues={},
    )  # fmt: skip
    p = _points(reader)
    assert [d.value for d in p["process.memory.usage"][1]] == [12345]
    assert [d.value for d in p["process.cpu.utilization"][1]] == [0.5]


class _RunState:
    """What a run's observable callbacks read; like a real run's, it holds the provider."""

    def __init__(self, provider: MeterProvider, count: int) -> None:
        self.provider = provider
        self.count = count

    def observe(self, _: object) -> list:
        from opentelemetry.metrics import Observation

        return [Observation(self.count)]


def test_an_observable_whose_callback_reaches_its_provider_does_not_keep_it_alive():
    """The registry that lets a later run or sampler take a meter's instruments over holds
    the meter weakly and its callbacks only through the instruments. A callback usually
    reaches its own provider (a run's state holds it): held strongly by the registry, every
    such provider, and everything its callbacks read, stayed alive for good."""
    import gc
    import weakref

    from otel_tunix.logger.instruments import observable
    from otel_tunix.model.metric_spec import Instrument

    reader = InMemoryMetricReader()  # not the fixture's: pytest would keep it (and mp)
    mp = MeterProvider(metric_readers=[reader])
    meter = mp.get_meter("test")
    observable(meter, Instrument.COUNTER, "test.count", _RunState(mp, 7).observe)
    assert [d.value for d in _points(reader)["test.count"][1]] == [7]
    # a later run on the same meter takes the instrument over
    observable(meter, Instrument.COUNTER, "test.count", _RunState(mp, 11).observe)
    assert [d.value for d in _points(reader)["test.count"][1]] == [11]
    mp.shutdown()  # its atexit hook holds it until then
    provider = weakref.ref(mp)
    del mp, meter, reader
    gc.collect()
    assert provider() is None


def test_background_thread_samples_at_the_interval_and_stops():
    s = SystemMetricsSampler(instruments=False, interval_sec=0.05)
    with s:
        time.sleep(0.3)
        first = s.latest
        assert first is not None
        assert status._sampler is s  # get_metrics_summary() shows its latest sample
        time.sleep(0.15)
        assert s.latest.time > first.time
    assert s._thread is None and status._sampler is None
    last = s.latest.time
    time.sleep(0.12)
    assert s.latest.time == last
    with pytest.raises(ValueError):
        SystemMetricsSampler(interval_sec=0)


def test_queue_depth_of_an_instrumented_queue(reader):
    q: queue.Queue[int] = queue.Queue()
    for i in range(3):
        q.put(i)
    instrument_queue(q, "rollouts")
    try:
        s = SystemMetricsSampler(MeterProvider(metric_readers=[reader]), process=False)
        assert s.sample().queues == {"rollouts": 3}
        depth = _points(reader)["tunix.queue.depth"][1][0]
        assert depth.value == 3 and dict(depth.attributes) == {"queue": "rollouts"}
        del q  # held weakly: a dropped queue stops reporting
        assert s.sample().queues == {}
        assert "rollouts" not in sysm._queues
    finally:
        sysm.uninstrument_queue("rollouts")


@no_gpu
def test_framework_memory_only_for_imported_frameworks_with_a_device():
    s = SystemMetricsSampler(instruments=False, process=False, framework=True)
    # torch is imported but has no CUDA here; JAX CPU devices report no memory stats
    assert s.sample().device_memory == ()


def test_gpu_reading_units_and_attributes():
    g = GpuReading(0, "GPU-abc", "NVIDIA H100 80GB HBM3", utilization=0.5,
                   memory_used_bytes=20 * 2**30, memory_total_bytes=80 * 2**30)  # fmt: skip
    assert g.memory_utilization == 0.25
    assert g.attributes("550.54") == {
        "hw.id": "GPU-abc", "hw.type": "gpu", "hw.name": "gpu0", "hw.vendor": "NVIDIA",
        "hw.model": "NVIDIA H100 80GB HBM3", "hw.driver_version": "550.54",
    }  # fmt: skip
    assert GpuReading(1, "", "x").memory_utilization is None
