"""A run's hyperparameters: ``configure(run_config={...})`` and ``otel_tunix.set_config()``.

As ``wandb.config``: the values are written to ``config.json`` in the run folder, and those
that are scalars (nested dicts flattened with dots) go on the run's OTel resource as
``tunix.config.<key>``, so every span and metric of the run carries them and a backend can
filter runs by them. The resource is made by ``configure()``: values set before it (with
:func:`set_config`) are on it; values set after it go to ``config.json`` only.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otel_tunix._current import get_current
from otel_tunix.settings import ConfigurationError

__all__ = ["CONFIG_FILE", "config_attributes", "set_config", "take_pending", "write_config"]

CONFIG_FILE = "config.json"
PREFIX = "tunix.config."

_lock = threading.Lock()
_pending: dict[str, Any] = {}  # set before configure(): taken by the next run
_by_run: dict[str, dict[str, Any]] = {}  # run id -> its config so far


def _flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def config_attributes(config: Mapping[str, Any]) -> dict[str, bool | int | float | str]:
    """``tunix.config.<key>`` resource attributes of the scalar values of ``config``
    (nested dicts flattened with dots; lists, ``None`` and objects left out)."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in _flat(config).items():
        if isinstance(value, bool | int | float | str):
            out[PREFIX + key] = value
        elif hasattr(value, "item") and getattr(value, "size", 1) == 1:  # numpy / torch
            out[PREFIX + key] = value.item()
    return out


def write_config(path: Path, config: Mapping[str, Any]) -> None:
    """Write ``config`` as JSON (values that JSON lacks as their ``str``), atomically."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(dict(config), indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


def take_pending(run_id: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config of a new run: what :func:`set_config` kept before it, then ``given``."""
    if given is not None and not isinstance(given, Mapping):
        raise ConfigurationError(f"run_config must be a dict, got a {type(given).__name__}")
    with _lock:
        config = {**_pending, **(given or {})}
        _pending.clear()
        _by_run.clear()
        _by_run[run_id] = config
    return dict(config)


def set_config(values: Mapping[str, Any] | None = None, /, **more: Any) -> dict[str, Any]:
    """Add hyperparameters to the run's config (``set_config({"lr": 3e-4}, batch=16)``).

    Before ``configure()`` they are kept for the next run (and go on its resource); after
    it they are merged into the run folder's ``config.json``.

    Returns:
        The run's whole config so far.
    """
    if values is not None and not isinstance(values, Mapping):
        raise TypeError(f"set_config() takes a dict, got a {type(values).__name__}")
    new = {**(values or {}), **more}
    run = get_current()
    with _lock:
        if run is None:
            _pending.update(new)
            return dict(_pending)
        config = _by_run.setdefault(run.info.run_id, {})
        config.update(new)
        snapshot = dict(config)
    if run.info.output_dir is not None:
        write_config(run.info.output_dir / CONFIG_FILE, snapshot)
    return snapshot
