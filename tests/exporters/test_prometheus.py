"""The Prometheus endpoint: scraped over real HTTP on loopback, parsed with prometheus_client."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_PROMETHEUS_HOST,
    OTEL_EXPORTER_PROMETHEUS_PORT,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from otel_tunix.exporters.prometheus import (
    OTEL_TUNIX_PROMETHEUS_HOST,
    OTEL_TUNIX_PROMETHEUS_PORT,
    PrometheusEndpoint,
    endpoint_reader,
)

LOOPBACK = "127.0.0.1"
BOUNDS = [0.001, 0.01, 0.1, 1, 10]
ENV_NAMES = (
    OTEL_TUNIX_PROMETHEUS_HOST,
    OTEL_TUNIX_PROMETHEUS_PORT,
    OTEL_EXPORTER_PROMETHEUS_HOST,
    OTEL_EXPORTER_PROMETHEUS_PORT,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def endpoint() -> Iterator[PrometheusEndpoint]:
    ep = PrometheusEndpoint(LOOPBACK, 0)
    yield ep
    ep.shutdown()


def _record_tunix_shaped(provider: MeterProvider) -> None:
    """Instruments shaped like otel-tunix's: seconds histograms and a step counter."""
    meter = provider.get_meter("tunix", "0.1.0")
    step_busy = meter.create_histogram(
        "tunix.step.busy_time",
        unit="s",
        description="Busy time per step",
        explicit_bucket_boundaries_advisory=BOUNDS,
    )
    component_busy = meter.create_histogram(
        "tunix.component.busy_time",
        unit="s",
        description="Busy time per component",
        explicit_bucket_boundaries_advisory=BOUNDS,
    )
    steps = meter.create_counter("tunix.steps", unit="{step}", description="Steps done")

    for value in (0.05, 0.5, 2.0):
        step_busy.record(value, {"scope": "train"})
    step_busy.record(0.0005, {"scope": "eval"})
    component_busy.record(0.2, {"scope": "train", "component": "train_data_load"})
    component_busy.record(0.02, {"scope": "train", "component": "train_step_compute"})
    component_busy.record(0.03, {"scope": "train", "component": "train_step_compute"})
    steps.add(3, {"scope": "train"})
    steps.add(1, {"scope": "eval"})


def _scrape(url: str, accept: str | None = None) -> str:
    headers = {"Accept": accept} if accept else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
        assert r.status == 200
        return r.read().decode()


def _families(text: str, parser=text_string_to_metric_families) -> dict[str, Metric]:
    return {family.name: family for family in parser(text)}


def _buckets(family: Metric, **labels: str) -> dict[float, float]:
    """Cumulative bucket counts {upper bound: count} of the series with these labels."""
    out: dict[float, float] = {}
    for sample in family.samples:
        if sample.name.endswith("_bucket") and all(
            sample.labels.get(k) == v for k, v in labels.items()
        ):
            out[float(sample.labels["le"])] = sample.value
    return out


def _value(family: Metric, suffix: str, **labels: str) -> float:
    matches = [
        s.value
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matches) == 1, (suffix, labels, family.samples)
    return matches[0]


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
            s.listen(1)
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def test_scrape_exposes_tunix_histograms_and_counter(endpoint: PrometheusEndpoint) -> None:
    provider = MeterProvider(
        metric_readers=[endpoint.reader], resource=Resource({"service.name": "trainer"})
    )
    try:
        _record_tunix_shaped(provider)
        families = _families(_scrape(endpoint.url))
    finally:
        provider.shutdown()

    # Dots become underscores, the unit "s" becomes a "_seconds" suffix, a counter gets
    # "_total"; the curly-brace annotation unit "{step}" is dropped from the name.
    step = families["tunix_step_busy_time_seconds"]
    component = families["tunix_component_busy_time_seconds"]
    steps = families["tunix_steps"]
    assert (step.type, component.type, steps.type) == ("histogram", "histogram", "counter")
    assert step.documentation == "Busy time per step"
    assert {s.name for s in steps.samples} == {"tunix_steps_total"}

    # Attributes become labels, next to the instrumentation scope's labels.
    train = {"scope": "train"}
    for sample in step.samples:
        assert sample.labels["otel_scope_name"] == "tunix"
        assert sample.labels["scope"] in ("train", "eval")
        assert "component" not in sample.labels
    assert {s.labels["component"] for s in component.samples} == {
        "train_data_load",
        "train_step_compute",
    }

    # The advisory boundaries are the buckets (seconds-shaped, not the 0..10000 default);
    # counts are cumulative, +Inf equals _count.
    inf = float("inf")
    assert _buckets(step, **train) == {0.001: 0, 0.01: 0, 0.1: 1, 1: 2, 10: 3, inf: 3}
    assert _buckets(step, scope="eval") == {0.001: 1, 0.01: 1, 0.1: 1, 1: 1, 10: 1, inf: 1}
    assert _value(step, "_count", **train) == 3
    assert _value(step, "_sum", **train) == pytest.approx(2.55)
    compute = {"scope": "train", "component": "train_step_compute"}
    assert _buckets(component, **compute) == {0.001: 0, 0.01: 0, 0.1: 2, 1: 2, 10: 2, inf: 2}
    assert _value(component, "_sum", **compute) == pytest.approx(0.05)
    assert _value(component, "_count", scope="train", component="train_data_load") == 1

    assert _value(steps, "_total", scope="train") == 3
    assert _value(steps, "_total", scope="eval") == 1

    # The resource goes to target_info, not onto every series.
    assert families["target_info"].samples[0].labels["service_name"] == "trainer"


def test_openmetrics_scrape_carries_units(endpoint: PrometheusEndpoint) -> None:
    provider = MeterProvider(metric_readers=[endpoint.reader])
    try:
        _record_tunix_shaped(provider)
        text = _scrape(endpoint.url, accept="application/openmetrics-text; version=1.0.0")
    finally:
        provider.shutdown()
    families = _families(text, parser=parse_openmetrics)
    assert families["tunix_step_busy_time_seconds"].unit == "seconds"
    assert families["tunix_component_busy_time_seconds"].unit == "seconds"
    assert families["tunix_steps"].unit == ""


def test_values_are_cumulative_across_scrapes(endpoint: PrometheusEndpoint) -> None:
    provider = MeterProvider(metric_readers=[endpoint.reader])
    try:
        counter = provider.get_meter("tunix").create_counter("tunix.steps", unit="{step}")
        counter.add(2, {"scope": "train"})
        first = _families(_scrape(endpoint.url))["tunix_steps"]
        counter.add(5, {"scope": "train"})
        second = _families(_scrape(endpoint.url))["tunix_steps"]
    finally:
        provider.shutdown()
    assert _value(first, "_total", scope="train") == 2
    assert _value(second, "_total", scope="train") == 7


def test_health_and_unknown_routes(endpoint: PrometheusEndpoint) -> None:
    with urllib.request.urlopen(endpoint.health_url, timeout=5) as response:
        assert response.status == 200
        assert response.read() == b"ok"
    assert endpoint.health_url == f"http://{LOOPBACK}:{endpoint.port}/healthz"
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        urllib.request.urlopen(f"http://{LOOPBACK}:{endpoint.port}/nope", timeout=5)
    assert excinfo.value.code == 404


def test_scrape_before_any_meter_provider_is_empty_not_an_error(
    endpoint: PrometheusEndpoint,
) -> None:
    assert list(text_string_to_metric_families(_scrape(endpoint.url))) == []


def test_port_zero_binds_a_real_port_and_shutdown_frees_it() -> None:
    ep = PrometheusEndpoint(LOOPBACK, 0)
    port = ep.port
    assert 0 < port < 65536
    assert ep.url == f"http://{LOOPBACK}:{port}/metrics"
    assert ep.running
    with socket.create_connection((LOOPBACK, port), timeout=5):
        pass
    assert not _port_is_free(port)

    ep.shutdown()
    assert not ep.running
    assert _port_is_free(port)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((LOOPBACK, port), timeout=5).close()


def test_shutdown_is_idempotent_in_any_order_with_the_meter_provider() -> None:
    # Endpoint first, then the provider (which shuts its reader down again).
    ep = PrometheusEndpoint(LOOPBACK, 0)
    provider = MeterProvider(metric_readers=[ep.reader])
    ep.shutdown()
    ep.shutdown()
    provider.shutdown()
    assert not ep.running

    # Provider first: shutting the provider down stops the endpoint's server too.
    ep = PrometheusEndpoint(LOOPBACK, 0)
    provider = MeterProvider(metric_readers=[ep.reader])
    provider.shutdown()
    assert not ep.running
    assert _port_is_free(ep.port)
    ep.shutdown()
    assert list(ep.registry.collect()) == []  # the reader's collector is unregistered


def test_two_endpoints_in_one_process_do_not_collide() -> None:
    first, second = PrometheusEndpoint(LOOPBACK, 0), PrometheusEndpoint(LOOPBACK, 0)
    providers = [MeterProvider(metric_readers=[ep.reader]) for ep in (first, second)]
    try:
        for provider, n in zip(providers, (1, 10), strict=True):
            provider.get_meter("tunix").create_counter("tunix.steps").add(n, {"scope": "train"})
        values = [
            _value(_families(_scrape(ep.url))["tunix_steps"], "_total", scope="train")
            for ep in (first, second)
        ]
    finally:
        for provider in providers:
            provider.shutdown()
    assert first.port != second.port
    assert values == [1, 10]


def test_port_env_vars_ours_win_over_the_standard_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    standard_port, our_port = _free_port(), _free_port()
    monkeypatch.setenv(OTEL_EXPORTER_PROMETHEUS_HOST, LOOPBACK)
    monkeypatch.setenv(OTEL_EXPORTER_PROMETHEUS_PORT, str(standard_port))
    ep = PrometheusEndpoint()
    try:
        assert (ep.host, ep.port) == (LOOPBACK, standard_port)
    finally:
        ep.shutdown()

    monkeypatch.setenv(OTEL_TUNIX_PROMETHEUS_HOST, LOOPBACK)
    monkeypatch.setenv(OTEL_TUNIX_PROMETHEUS_PORT, str(our_port))
    monkeypatch.setenv(OTEL_EXPORTER_PROMETHEUS_HOST, "not-a-host.invalid")
    ep = PrometheusEndpoint()
    try:
        assert (ep.host, ep.port) == (LOOPBACK, our_port)
    finally:
        ep.shutdown()


def test_default_host_is_loopback_and_arguments_win_over_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ep = PrometheusEndpoint()
    try:
        assert ep.host == LOOPBACK
    finally:
        ep.shutdown()
    monkeypatch.setenv(OTEL_TUNIX_PROMETHEUS_PORT, "not a port")
    ep = PrometheusEndpoint(port=0)  # the argument wins, the bad variable is not read
    ep.shutdown()


@pytest.mark.parametrize("name", [OTEL_TUNIX_PROMETHEUS_PORT, OTEL_EXPORTER_PROMETHEUS_PORT])
@pytest.mark.parametrize("raw", ["abc", "-1", "65536", "80.5"])
def test_bad_port_env_raises_value_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str
) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=name):
        PrometheusEndpoint(LOOPBACK)


@pytest.mark.parametrize("port", [-1, 70000, True])
def test_bad_port_argument_raises_value_error(port: int) -> None:
    with pytest.raises(ValueError, match="port"):
        PrometheusEndpoint(LOOPBACK, port)


def test_taken_port_raises_oserror_naming_the_address(endpoint: PrometheusEndpoint) -> None:
    with pytest.raises(OSError, match=f"{LOOPBACK}:{endpoint.port}"):
        PrometheusEndpoint(LOOPBACK, endpoint.port)


def test_endpoint_reader_is_configured_from_env_and_stops_with_the_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = _free_port()
    monkeypatch.setenv(OTEL_TUNIX_PROMETHEUS_PORT, str(port))
    provider = MeterProvider(metric_readers=[endpoint_reader()])
    try:
        provider.get_meter("tunix").create_counter("tunix.steps").add(4, {"scope": "train"})
        families = _families(_scrape(f"http://{LOOPBACK}:{port}/metrics"))
        assert _value(families["tunix_steps"], "_total", scope="train") == 4
    finally:
        provider.shutdown()
    assert _port_is_free(port)


@pytest.mark.parametrize("labels_on", [True, False])
def test_configure_labels_every_series_with_service_and_run_id(
    monkeypatch: pytest.MonkeyPatch, labels_on: bool
) -> None:
    """One Prometheus scraping several jobs tells their series apart by service and run id
    (opt-out: OTEL_TUNIX_PROMETHEUS_RUN_LABELS=false)."""
    import otel_tunix

    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_TUNIX_PROMETHEUS_RUN_LABELS", str(labels_on).lower())
    info = otel_tunix.configure(service_name="trainer-a", output_dir="none", run_id="job-7")
    try:
        for n in range(3):
            with otel_tunix.step(n), otel_tunix.component("forward"):
                pass
        otel_tunix.force_flush()
        families = _families(_scrape(info.endpoints["prometheus"]))
    finally:
        otel_tunix.shutdown()
    samples = [s for f in families.values() for s in f.samples]
    assert any(s.name == "tunix_steps_total" for s in samples)
    for sample in samples:
        if labels_on:
            assert sample.labels["service"] == "trainer-a", sample
            assert sample.labels["run_id"] == "job-7", sample
        else:
            assert "service" not in sample.labels and "run_id" not in sample.labels
