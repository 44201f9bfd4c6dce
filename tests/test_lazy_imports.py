"""``import otel_tunix`` and ``configure()`` import only what a run uses (issue #35 item 6):
the public names of ``otel_tunix`` and ``otel_tunix.metrics`` load on first use (PEP 562).

Each check runs in a fresh interpreter, so nothing another test imported hides a module."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from processes import child_env

_HEAVY = (
    "numpy",
    "torch",
    "jax",
    "transformers",
    "tensorboardX",
    "wandb",
    "otel_tunix.rl",
    "otel_tunix.metrics.lineage",
    "otel_tunix.metrics.weight_sync",
    "otel_tunix.metrics.rl",
    "otel_tunix.metrics.generation",
    "otel_tunix.metrics.flops",
    "otel_tunix.metrics.training",
    "otel_tunix.logger.backends",
)
"""What ``import otel_tunix`` and a default ``configure()`` imported before and no longer do."""


def _child(code: str, cwd: Path) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it prints one JSON line, returned here."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=child_env(OTEL_TUNIX_QUIET="true"),
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_import_otel_tunix_imports_none_of_its_modules(tmp_path: Path) -> None:
    got = _child(
        """
        import json, sys
        import otel_tunix
        print(json.dumps(sorted(m for m in sys.modules
                                if m.startswith(("otel_tunix", "opentelemetry", "numpy")))))
        """,
        tmp_path,
    )
    assert got == ["otel_tunix"]


def test_default_configure_imports_no_heavy_module(tmp_path: Path) -> None:
    got = _child(
        f"""
        import json, sys
        import otel_tunix
        otel_tunix.configure()
        with otel_tunix.step(0, scope="train"):
            with otel_tunix.component("train_step_compute"):
                pass
        loaded = sorted(set({list(_HEAVY)!r}) & set(sys.modules))
        otel_tunix.shutdown()
        print(json.dumps({{"loaded": loaded, "run": "otel_tunix.run.setup" in sys.modules}}))
        """,
        tmp_path,
    )
    assert got == {"loaded": [], "run": True}


def test_every_public_name_resolves_to_its_home(tmp_path: Path) -> None:
    got = _child(
        """
        import importlib, json, types
        import otel_tunix
        import otel_tunix.metrics as metrics
        out = {}
        for package in (otel_tunix, metrics):
            homes = package._HOMES
            names = list(package.__all__)
            wrong = []
            for name in names:
                value = getattr(package, name)
                if name == "rl":
                    ok = isinstance(value, types.ModuleType) and (
                        value.__name__ == package.__name__ + ".rl")
                else:
                    ok = value is getattr(importlib.import_module(homes[name]), name)
                if not ok:
                    wrong.append(name)
            try:
                getattr(package, "no_such_name")
                missing = "no error"
            except AttributeError as e:
                missing = str(e)
            out[package.__name__] = {
                "names": len(names),
                "homes": sorted(set(homes) | {"rl"}) == sorted(names),
                "wrong": wrong,
                "in_dir": sorted(set(names) - set(dir(package))),
                "missing": missing,
            }
        from otel_tunix import *  # noqa: F403
        from otel_tunix.metrics import TrainingMetrics, rl
        out["star"] = configure is otel_tunix.configure  # noqa: F405
        out["from"] = [TrainingMetrics.__module__, rl.__name__, otel_tunix.rl.consume.__module__]
        print(json.dumps(out))
        """,
        tmp_path,
    )
    for package, count in (("otel_tunix", 30), ("otel_tunix.metrics", 22)):
        assert got[package] == {
            "names": count,
            "homes": True,
            "wrong": [],
            "in_dir": [],
            "missing": f"module {package!r} has no attribute 'no_such_name'",
        }
    assert got["star"] is True
    assert got["from"] == [
        "otel_tunix.metrics.training",
        "otel_tunix.metrics.rl",
        "otel_tunix.metrics.lineage",
    ]
