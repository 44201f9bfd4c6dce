"""The one settings table: every variable read once, through it, with one error shape."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import otel_tunix
from otel_tunix.settings.parsing import ConfigurationError
from otel_tunix.settings.table import SETTINGS, markdown_table
from otel_tunix.settings.values import Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "otel_tunix"

# A value each parser refuses, by the row's ``allowed`` text.
_BAD = {
    "true or false (also 1/0, yes/no, on/off)": "maybe",
    "a positive integer": "0",
    "a non-negative integer": "-1",
    "a port number 0-65535": "70000",
    "grpc or http/protobuf": "http/json",
    "a number of seconds > 0, or 0 / none": "-3",
}


def _bad_value(allowed: str) -> str | None:
    for prefix, bad in _BAD.items():
        if allowed.startswith(prefix):
            return bad
    if allowed.startswith("a number of milliseconds"):
        return "soon"
    return None


def test_the_table_and_the_settings_object_name_the_same_fields_and_defaults() -> None:
    defaults = Settings()
    for setting in SETTINGS:
        if setting.field:
            assert getattr(defaults, setting.field) == setting.default, setting.name
    assert load_settings({}) == defaults
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    "setting",
    [s for s in SETTINGS if s.field and _bad_value(s.allowed) is not None],
    ids=lambda s: s.name,
)
def test_a_bad_value_of_any_variable_names_it_and_what_is_allowed(setting) -> None:
    bad = _bad_value(setting.allowed)
    with pytest.raises(ConfigurationError) as err:
        load_settings({setting.name: bad})
    assert str(err.value) == f"{setting.name}={bad!r} is not allowed; use {setting.allowed}"


def test_a_bad_value_fails_configure_and_records_nothing(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DATADOG_ENABLED", "perhaps")
    with pytest.raises(ConfigurationError, match=r"DATADOG_ENABLED='perhaps'"):
        otel_tunix.configure(output_dir=tmp_path / "run")
    assert otel_tunix.current_run() is None
    assert not (tmp_path / "run").exists()


def test_values_parse_to_their_types() -> None:
    s = load_settings(
        {
            "OTEL_TUNIX_SAMPLING_RATE": " 4 ",
            "OTEL_TUNIX_COMPONENTS": "a, b,,c",
            "OTEL_TUNIX_SYSTEM_METRICS_INTERVAL": "none",
            "OTEL_TRACES_EXPORTER": "OTLP, Console",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            "SLURM_PROCID": "3",
            "SLURM_NTASKS": "8",
            "RANK": "",  # blank: unset
            "OTEL_BSP_MAX_QUEUE_SIZE": "64",
        }
    )
    assert s.sampling_rate == 4
    assert s.components == ("a", "b", "c")
    assert s.system_metrics_interval is None
    assert s.exporters("traces") == ("otlp", "console")
    assert s.exporters("metrics") == ()
    assert s.exporters("logs") == ()  # no endpoint for logs
    assert s.otlp_protocol_of("traces") == "grpc"
    assert s.otlp_protocol_of("metrics") == "http/protobuf"
    assert (s.launcher_rank, s.launcher_world_size) == (3, 8)
    assert s.bsp_max_queue_size == 64
    with_endpoint = load_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    assert with_endpoint.exporters("logs") == ("otlp",)


def test_the_readme_configuration_table_is_the_one_generated_from_the_settings_table() -> None:
    text = (ROOT / "README.md").read_text()
    start = text.index(
        "<!-- settings table: generated from otel_tunix.settings.table.SETTINGS -->\n"
    )
    end = text.index("<!-- end of settings table -->")
    block = text[text.index("\n", start) + 1 : end]
    assert block == markdown_table(), "regenerate it with: python -m otel_tunix.settings.table"
    assert {s.name for s in SETTINGS} == set(re.findall(r"^\| `([A-Z0-9_]+)`", block, re.M))


def test_the_environment_is_read_only_by_the_settings_module() -> None:
    """``os.environ`` / ``os.getenv`` appear in settings/values.py only, and in the distro, which
    sets (never reads for itself) ``OTEL_PYTHON_CONFIGURATOR`` for opentelemetry-instrument."""
    readers: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                if isinstance(node.value, ast.Name) and node.value.id == "os":
                    readers.add(str(path.relative_to(PACKAGE)))
    assert readers == {"settings/values.py", "instrumentation/distro.py"}
