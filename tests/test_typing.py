"""The README's Python examples type-check as user code.

Each example is written to a file of its own after a prelude that defines the names the
example leaves to the reader (``steps``, ``it``, ``model``, ...), as a user's script would,
and mypy checks it with this repository's package importable. Like an installed package
(``py.typed``), otel_tunix is analysed but its own errors are not reported: only the
example's are (``mypy otel_tunix`` checks the package itself).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
_QUICK_START = "## Quick start"

# --- preludes: the names each example uses without defining them ---------------------------
QUICK_START_PRELUDE = """\
import queue
from collections.abc import Iterator

steps = 10
it: Iterator[list[float]] = iter([[0.5, 1.5]] * steps)
q: queue.Queue[int] = queue.Queue()


def train_step(batch: list[float]) -> float:
    return sum(batch) / len(batch)
"""

# Keyed by the import that names the integration an example shows; values: (file name, prelude).
FRAMEWORK_PRELUDES = {
    "from otel_tunix.instrumentation import torch": (
        "readme_torch",
        """\
import torch
from torch.utils.data import DataLoader, TensorDataset

import otel_tunix

n = 0
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.MSELoss()
loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
""",
    ),
    "from otel_tunix.instrumentation.transformers import": (
        "readme_transformers",
        """\
import torch
from transformers import Trainer

trainer = Trainer(model=torch.nn.Linear(4, 1))
""",
    ),
    "from otel_tunix.instrumentation.jax import": (
        "readme_jax",
        """\
import jax
import jax.numpy as jnp

import otel_tunix

n = 0
state = jnp.zeros(4)
batch = jnp.ones(4)


def train_step(state: jax.Array, batch: jax.Array) -> tuple[jax.Array, jax.Array]:
    state = state - 0.1 * batch
    return state, jnp.mean(state)
""",
    ),
    "from otel_tunix.instrumentation.tunix import": (
        "readme_tunix",
        """\
from typing import Any

from tunix import PeftTrainer

import otel_tunix

trainer: PeftTrainer
train_ds: list[dict[str, Any]] = []
eval_ds: list[dict[str, Any]] = []
""",
    ),
}

# A user's configuration: the package found as if installed, its errors not the user's, and
# the untyped Tunix (no py.typed, no stubs) declared as such.
MYPY_INI = f"""\
[mypy]
python_version = 3.11
mypy_path = {ROOT}

[mypy-otel_tunix.*]
follow_imports = silent

[mypy-tunix.*]
ignore_missing_imports = True
"""


def quick_start_block(readme: str) -> str:
    """The first ```python block after the "## Quick start" heading."""
    heading = re.search(rf"^{re.escape(_QUICK_START)}\s*$", readme, re.MULTILINE)
    assert heading, f"README.md has no {_QUICK_START!r} heading"
    block = _PYTHON_BLOCK.search(readme, heading.end())
    assert block, f"README.md has no ```python block after {_QUICK_START!r}"
    return block.group(1)


def framework_blocks(readme: str) -> dict[str, str]:
    """Every other ```python block that uses otel_tunix, keyed by its prelude's key."""
    quick_start = quick_start_block(readme)
    found: dict[str, str] = {}
    for match in _PYTHON_BLOCK.finditer(readme):
        code = match.group(1)
        if code == quick_start or "otel_tunix" not in code:
            continue
        keys = [key for key in FRAMEWORK_PRELUDES if key in code]
        assert len(keys) == 1, (
            "tests/test_typing.py has no prelude (or more than one) for this README example; "
            f"add one to FRAMEWORK_PRELUDES:\n{code}"
        )
        assert keys[0] not in found, f"two README examples for {keys[0]!r}"
        found[keys[0]] = code
    return found


def run_mypy(tmp_path: Path, cache_dir: Path, sources: dict[str, str]) -> None:
    """Write ``sources`` (module name -> code) under ``tmp_path`` and assert mypy passes."""
    (tmp_path / "mypy.ini").write_text(MYPY_INI)
    files = []
    for name, code in sources.items():
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        files.append(path.name)
    command = [sys.executable, "-m", "mypy", "--config-file", "mypy.ini"]
    proc = subprocess.run(
        [*command, "--cache-dir", str(cache_dir), *files],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    listing = "\n\n".join(
        f"--- {name}.py ---\n"
        + "\n".join(f"{i:3} {line}" for i, line in enumerate(code.splitlines(), 1))
        for name, code in sources.items()
    )
    assert proc.returncode == 0, (
        f"mypy exited {proc.returncode}:\n{proc.stdout}{proc.stderr}\n{listing}"
    )


def user_file(prelude: str, example: str) -> str:
    return f"{prelude}\n# --- the README example ---\n{example}"


@pytest.fixture(scope="session")
def mypy_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mypy's cache: shared by these tests, and kept in pytest's cache when that is enabled."""
    cache = getattr(request.config, "cache", None)
    if cache is None:
        return tmp_path_factory.mktemp("mypy_cache")
    return Path(cache.mkdir("mypy-readme"))


def test_readme_quick_start_typechecks(tmp_path: Path, mypy_cache: Path) -> None:
    example = quick_start_block(README.read_text(encoding="utf-8"))
    assert "otel_tunix.configure(" in example
    run_mypy(tmp_path, mypy_cache, {"readme_quick_start": user_file(QUICK_START_PRELUDE, example)})


def test_a_misused_api_fails_the_check(tmp_path: Path, mypy_cache: Path) -> None:
    """The check sees otel_tunix's own types (not Any): a wrong argument is an error."""
    example = quick_start_block(README.read_text(encoding="utf-8"))
    example += "otel_tunix.configure(service_name=1)\n"
    with pytest.raises(AssertionError, match=r'"service_name" to "configure" has incompatible'):
        run_mypy(tmp_path, mypy_cache, {"readme_misused": user_file(QUICK_START_PRELUDE, example)})


@pytest.mark.slow
def test_readme_framework_examples_typecheck(tmp_path: Path, mypy_cache: Path) -> None:
    blocks = framework_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no framework examples"
    run_mypy(
        tmp_path,
        mypy_cache,
        {
            FRAMEWORK_PRELUDES[key][0]: user_file(FRAMEWORK_PRELUDES[key][1], code)
            for key, code in blocks.items()
        },
    )
