"""configure() never blocks on a file (issue #36 case 9): an earlier attempt's spans file
that is a FIFO (or a link to one), a certificate variable naming a FIFO, ``/dev/zero`` or a
directory, a FIFO where a run file goes. Each is tried in a child process with a timeout,
so that a regression fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from processes import child_env

_CHILD = r"""
import json, sys, time
import otel_tunix
from otel_tunix.settings.parsing import ConfigurationError

try:
    info = otel_tunix.configure(system_metrics=False, alerts=False)
except ConfigurationError as exc:
    print(json.dumps({"error": str(exc)}))
    sys.exit(0)
with otel_tunix.step(0), otel_tunix.component("work"):
    pass
otel_tunix.shutdown()
print(json.dumps({"folder": str(info.output_dir), "attempt": info.job.attempt}))
"""


def _configure(tmp_path: Path, **env: str) -> tuple[dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=child_env(OTEL_TUNIX_JOB_ID="j", **env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("link", [False, True], ids=["a FIFO", "a link to a FIFO"])
def test_an_earlier_attempts_spans_file_that_is_a_fifo_is_skipped(
    tmp_path: Path, link: bool
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    if link:
        (out / "spans.jsonl").symlink_to(fifo)
    else:
        os.mkfifo(out / "spans.jsonl")
    result, stderr = _configure(tmp_path, OTEL_TUNIX_OUTPUT_DIR=str(out))
    assert result == {"folder": str(out / "run-2"), "attempt": 1}  # nothing read from it
    assert "a FIFO" in stderr and str(out / "spans.jsonl") in stderr and "skipped" in stderr


def test_a_fifo_where_a_run_file_goes_is_a_configuration_error(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "metrics.jsonl")  # no reader: an open for writing would wait for one
    result, _ = _configure(tmp_path, OTEL_TUNIX_OUTPUT_DIR=str(out))
    error = str(result["error"])
    assert "OTEL_TUNIX_OUTPUT_DIR" in error and "metrics.jsonl" in error


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory", "large"])
@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY"]
)
def test_a_certificate_that_is_no_regular_file_is_refused_by_name(
    tmp_path: Path, kind: str, variable: str
) -> None:
    """A FIFO blocked configure() for ever, /dev/zero read until the OOM killer (23.4 GB),
    a directory raised a raw IsADirectoryError."""
    path = tmp_path / "ca.pem"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "large":
        with path.open("wb") as f:
            f.truncate((16 << 20) + 1)  # sparse: no disk used
    else:
        path = Path(kind)
    result, _ = _configure(
        tmp_path,
        **{variable: str(path)},
        OTEL_EXPORTER_OTLP_ENDPOINT="https://127.0.0.1:1",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_TUNIX_OUTPUT_DIR="none",
    )
    error = str(result["error"])
    assert variable in error and "regular file" in error
