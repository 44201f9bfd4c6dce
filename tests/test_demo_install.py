"""What ``make demo`` installs: the ``demo`` extra only (CPU torch on a machine without an
NVIDIA GPU), and ``make test`` after it adds the rest. The Makefile's own commands
(``make -n``) are resolved by pip without downloading (``--dry-run --report``); the test
prints the demo's package count and size."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from processes import shell_env

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {"jax", "jaxlib", "ray", "transformers", "trl", "wandb", "google-tunix", "pandas"}

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _make_n(target: str, venv: Path, *, always: bool = True) -> list[list[str]]:
    """The commands ``make`` would run for ``target`` with ``.venv`` at ``venv``."""
    args = ["make", "-n", *(["-B"] if always else []), target, f"VENV={venv}"]
    out = subprocess.run(
        [*args, f"PY={sys.executable}"],
        cwd=ROOT,
        env=shell_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [shlex.split(line) for line in out.splitlines() if line and not line.startswith("#")]


def _pip_installs(commands: list[list[str]]) -> list[list[str]]:
    """The arguments after ``pip install -q`` of each install command (pip's upgrade aside)."""
    out = []
    for cmd in commands:
        if len(cmd) > 2 and cmd[0].endswith("/pip") and cmd[1] == "install":
            args = [a for a in cmd[2:] if a != "-q"]
            if args != ["--upgrade", "pip"]:
                out.append(args)
    return out


def _resolve(args: list[str], report: Path) -> list[dict[str, object]]:
    """What ``pip install args`` would install into an empty environment."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--retries", "0", "--report", str(report), *args],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    items: list[dict[str, object]] = json.loads(report.read_text())["install"]
    return items


def _size(url: str) -> int | None:
    """Bytes of the file at ``url`` (a local index's file, or a HEAD request); ``None`` for
    a directory (the checkout itself) or when unknown."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = Path(urllib.parse.unquote(parsed.path))
        return path.stat().st_size if path.is_file() else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as r:
            length = r.headers.get("Content-Length")
            return int(length) if length else None
    except OSError:
        return None


def test_make_demo_installs_the_demo_extra_and_make_test_the_rest(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    demo = _pip_installs(_make_n("demo", venv))
    torch_args, demo_args = demo
    assert demo_args == ["-e", ".[demo]"]  # the demo extra, nothing else
    assert torch_args[0].startswith("torch==")
    if shutil.which("nvidia-smi") is None:  # no GPU here: PyTorch's CPU build
        assert torch_args[1:] == ["--index-url", "https://download.pytorch.org/whl/cpu"]
    test = _pip_installs(_make_n("test", venv))
    assert test == [torch_args, demo_args, ["-e", ".[dev]"]]

    # After `make demo`, `make test` installs only the rest (the stamps are layered).
    venv.mkdir()
    for stamp in (".installed-torch", ".installed-demo"):
        (venv / stamp).touch()
    assert _pip_installs(_make_n("test", venv, always=False)) == [["-e", ".[dev]"]]
    assert _pip_installs(_make_n("demo", venv, always=False)) == []

    # What the demo's two installs put into an empty environment, resolved, not downloaded.
    torch_items = _resolve(torch_args, tmp_path / "torch.json")
    torch_version = next(
        str(i["metadata"]["version"])  # type: ignore[index]
        for i in torch_items
        if i["metadata"]["name"] == "torch"  # type: ignore[index]
    )
    index = ["--extra-index-url", *torch_args[2:]] if torch_args[1:] else []
    rest = _resolve([*demo_args, f"torch=={torch_version}", *index], tmp_path / "demo.json")
    packages: dict[str, str] = {}
    for item in [*torch_items, *rest]:
        meta, info = item["metadata"], item["download_info"]
        packages[str(meta["name"]).lower()] = str(info["url"])  # type: ignore[index]
    sizes = {name: _size(url) for name, url in packages.items()}
    known = sum(s for s in sizes.values() if s is not None)
    unknown = sorted(n for n, s in sizes.items() if s is None and n != "otel-tunix")
    print(
        f"\nmake demo installs {len(packages)} packages, {known / 1e6:.0f} MB of wheels"
        f"{f' (size unknown: {unknown})' if unknown else ''}; torch {torch_version}: "
        f"{(sizes.get('torch') or 0) / 1e6:.0f} MB"
    )
    assert {"otel-tunix", "torch", "rich", "orjson", "opentelemetry-sdk"} <= set(packages)
    assert not HEAVY & set(packages), HEAVY & set(packages)
    if shutil.which("nvidia-smi") is None:
        assert not [n for n in packages if n.startswith("nvidia-")]  # no CUDA libraries


def test_make_demo_otlp_adds_the_otlp_extra_and_sends_the_demo_to_a_collector(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    commands = _make_n("demo-otlp", venv)
    torch_args, demo_args, otlp_args = _pip_installs(commands)
    assert torch_args[0].startswith("torch==") and demo_args == ["-e", ".[demo]"]
    assert otlp_args == ["-e", ".[demo,otlp]"]  # between `make demo` and `make test`
    assert commands[-1] == [
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317",
        f"{venv}/bin/otel-tunix",
        "demo",
    ]
    # after `make demo`, only the otlp extra is added
    venv.mkdir()
    for stamp in (".installed-torch", ".installed-demo"):
        (venv / stamp).touch()
    assert _pip_installs(_make_n("demo-otlp", venv, always=False)) == [otlp_args]


def test_make_test_pythons_runs_the_core_tests_on_each_python_and_is_not_in_make_test() -> None:
    def dry(*args: str) -> str:
        return subprocess.run(
            ["make", "-n", *args],
            cwd=ROOT,
            env=shell_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    pythons = "/py312/bin/python3 /py313/bin/python3"
    loop = dry("test-pythons", f"PYTHONS={pythons}")
    assert f"for py in {pythons}; do" in loop
    assert ".venv-pythons/$($py -c" in loop and ".[otlp,cli]" in loop  # a venv of each
    core = re.search(r"CORE_TESTS \?= (.*?)\n\n", (ROOT / "Makefile").read_text(), re.S)
    assert core is not None
    files = core.group(1).replace("\\", " ").split()
    assert files and all((ROOT / f).is_file() for f in files)
    assert f"pytest -q -p no:cacheprovider {' '.join(files)}" in loop
    assert ".venv-pythons" not in dry("-B", "test", "VENV=/nowhere")  # not part of make test
