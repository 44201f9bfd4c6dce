"""The README's install lines, run as written in a fresh virtual environment: the core from a
checkout, then the core with extras; what a core install says when a feature needs an extra.

A real ``pip install`` (from PyPI or the machine's package index), so it takes a while."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

pytestmark = pytest.mark.slow


def _checkout_copy(dest: Path) -> Path:
    """The files a pip install of the checkout reads, copied to ``dest``: the build writes
    its ``build/`` and ``*.egg-info`` there, not into the repository (a stale ``build/lib``
    there would put modules deleted since into a later wheel)."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "otel_tunix", dest / "otel_tunix", ignore=shutil.ignore_patterns("__pycache__")
    )
    return dest


def _install_lines(checkout: Path) -> list[list[str]]:
    """The ``pip install`` lines of the README's install section that install from a
    checkout (``./otel-tunix``), as argument lists with ``checkout`` as its path."""
    section = README[README.index("## Install") : README.index("## Quick start")]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    lines = []
    for line in block.group(1).splitlines():
        args = shlex.split(line, comments=True)
        if args[:2] == ["pip", "install"] and args[2].startswith("./otel-tunix"):
            lines.append([*args[:2], args[2].replace("./otel-tunix", str(checkout), 1)])
    return lines


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


_CORE_CHECK = textwrap.dedent(
    """
    import os, sys
    import otel_tunix
    from otel_tunix.settings.parsing import ConfigurationError

    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    try:
        otel_tunix.configure(output_dir="none")
    except ConfigurationError as exc:
        print("OTLP:", exc)
    del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    os.environ["OTEL_TRACES_EXPORTER"] = "perfetto"
    try:
        otel_tunix.configure(output_dir="none")
    except ConfigurationError as exc:
        print("PERFETTO:", exc)
    del os.environ["OTEL_TRACES_EXPORTER"]
    os.environ["OTEL_TUNIX_QUIET"] = "false"
    otel_tunix.configure(output_dir=sys.argv[1])
    with otel_tunix.step(0), otel_tunix.component("work"):
        pass
    otel_tunix.shutdown()
    """
)


def test_the_readme_install_lines_in_a_fresh_venv(tmp_path: Path) -> None:
    checkout = _checkout_copy(tmp_path / "otel-tunix")
    core, with_extras = _install_lines(checkout)
    assert core[2] == str(checkout) and with_extras[2].startswith(f"{checkout}[")
    extras = with_extras[2][len(str(checkout)) + 1 : -1].split(",")
    assert "cli" in extras

    venv = tmp_path / "venv"
    made = _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    bin_ = venv / "bin"

    done = _run(bin_ / "python", "-m", *core, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = _run(bin_ / "python", "-m", "pip", "list", "--format=freeze", cwd=tmp_path).stdout
    names = {line.split("==")[0].lower() for line in listed.splitlines()}
    print(f"\ncore install: {len(names)} packages: {' '.join(sorted(names))}")
    assert "otel-tunix" in names and "rich" not in names and "torch" not in names

    run = tmp_path / "run"
    checked = _run(bin_ / "python", "-c", _CORE_CHECK, run, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr[-3000:]
    # the OTLP endpoint the user set, and the extra that sends to it
    otlp = next(x for x in checked.stdout.splitlines() if x.startswith("OTLP:"))
    assert otlp == (
        "OTLP: OTEL_EXPORTER_OTLP_ENDPOINT is set, which sends spans over OTLP, but the OTLP "
        "exporter is not installed: pip install 'otel-tunix[otlp]'"
    )
    perfetto = next(x for x in checked.stdout.splitlines() if x.startswith("PERFETTO:"))
    assert perfetto.startswith("PERFETTO: OTEL_TRACES_EXPORTER names 'perfetto', but ")
    assert perfetto.endswith("pip install 'otel-tunix[perfetto]'")
    # what the end notice says to run next needs the cli extra, and says so
    # (as this environment's script, relative to the working folder: not on the PATH here)
    needs = "   (needs pip install 'otel-tunix[cli]')"
    assert f"next: venv/bin/otel-tunix summary {run}{needs}" in checked.stderr
    summary = _run(bin_ / "otel-tunix", "summary", run, cwd=tmp_path)
    assert summary.returncode != 0
    assert "pip install 'otel-tunix[cli]'" in summary.stderr

    done = _run(bin_ / "python", "-m", *with_extras, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = _run(bin_ / "otel-tunix", "summary", run, cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr
    assert "work" in summary.stdout


def _requirements(extras: dict[str, list[str]], extra: str) -> set[str]:
    """The distributions an extra installs, its nested ``otel-tunix[...]`` extras included."""
    out: set[str] = set()
    for req in extras[extra]:
        nested = re.fullmatch(r"otel-tunix\[(.*)\]", req)
        if nested:
            for name in nested.group(1).split(","):
                out |= _requirements(extras, name.strip())
        else:
            out.add(re.split(r"[<>=\[ ;]", req, maxsplit=1)[0].lower())
    return out


def test_each_framework_extra_carries_its_instrumentor() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    instrumentors = project["entry-points"]["opentelemetry_instrumentor"]
    for entry, target in instrumentors.items():
        framework = target.split(":")[0].rsplit(".", 1)[-1]  # otel_tunix.instrumentation.torch
        needs = _requirements(extras, framework)
        assert "opentelemetry-instrumentation" in needs, (entry, framework, needs)
        assert framework in needs or framework in {"tunix"}, (framework, needs)
    assert "google-tunix" in _requirements(extras, "tunix")
