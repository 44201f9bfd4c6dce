"""Shared fixtures: a clean OTel / otel-tunix state and environment for every test, a
configured run with its run folder (``local_run``), a real collector (``rotel_collector``).
The one JSONL reader and the run folder's files are in ``tests/run_files.py``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from run_files import RunFolder

import otel_tunix
from otel_tunix.testing import reset

_PREFIXES = ("OTEL_", "DD_", "DATADOG_")
_LAUNCHER_VARS = frozenset(
    "RANK WORLD_SIZE LOCAL_RANK SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_JOB_ID"
    " TORCHELASTIC_RUN_ID TORCHELASTIC_RESTART_COUNT SLURM_RESTART_COUNT"
    " OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE".split()
)


@pytest.fixture(autouse=True)
def clean_otel_state(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[None]:
    """No OTEL_* / DD_* / launcher variables leak in, the cwd is a temp dir, globals reset."""
    for name in list(os.environ):
        if name.startswith(_PREFIXES) or name in _LAUNCHER_VARS:
            monkeypatch.delenv(name, raising=False)
    # An internal error of otel-tunix fails the test instead of being reported and skipped
    # (a test of that reporting turns it off for itself).
    monkeypatch.setenv("OTEL_TUNIX_RAISE_INTERNAL_ERRORS", "true")
    # No notes on stderr from every configure() / shutdown() (tests/test_notices.py turns
    # them on for itself).
    monkeypatch.setenv("OTEL_TUNIX_QUIET", "true")
    monkeypatch.chdir(tmp_path)
    reset()
    yield
    reset()


@pytest.fixture
def local_run(tmp_path: Path) -> Iterator[Callable[..., RunFolder]]:
    """``configure()`` with a run folder of its own (``tmp_path / "run"``, system metrics off
    unless given): call it with ``configure()``'s keyword arguments, get the
    :class:`run_files.RunFolder` to read once the test has called ``otel_tunix.shutdown()``
    (teardown shuts the run down if the test did not)."""

    def start(**kwargs: Any) -> RunFolder:
        kwargs.setdefault("output_dir", tmp_path / "run")
        kwargs.setdefault("system_metrics", False)
        otel_tunix.configure(**kwargs)
        return RunFolder(Path(kwargs["output_dir"]))

    yield start
    otel_tunix.shutdown()


# --- a real OpenTelemetry collector (rotel) on loopback; see tests/collector.py -----------

from collector import RotelCollector  # noqa: E402


@pytest.fixture
def rotel_factory(tmp_path: Path) -> Iterator[Callable[..., RotelCollector]]:
    """Starts rotel collectors on free loopback ports; all are stopped (by pid) at teardown.

    Call it with :class:`collector.RotelCollector`'s keyword arguments (``args``, ``env``,
    ``grpc_port``, ``http_port``); each call gets its own log file under ``tmp_path``.
    """
    started: list[RotelCollector] = []

    def start(**kwargs: object) -> RotelCollector:
        log = tmp_path / f"rotel-{len(started)}.log"
        collector = RotelCollector(log, **kwargs)  # type: ignore[arg-type]
        started.append(collector)
        return collector.start()

    yield start
    for collector in reversed(started):
        collector.stop()


@pytest.fixture
def rotel_collector(rotel_factory: Callable[..., RotelCollector]) -> RotelCollector:
    """A rotel collector with a blackhole exporter that prints every span and metric it
    receives (``.output()``, ``.parsed()``, ``.wait_for(...)``, ``.restart()``)."""
    return rotel_factory()


# --- a collector that accepts and never answers -------------------------------------------

import socket  # noqa: E402
import threading  # noqa: E402


@pytest.fixture
def hung_collector() -> Iterator[int]:
    """A loopback port that accepts every connection and never answers on it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # closed at teardown
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for conn in held:
        conn.close()
