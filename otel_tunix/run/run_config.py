"""A run's hyperparameters: ``configure(run_config={...})`` and ``otel_tunix.set_config()``.

As ``wandb.config``: the values are written to ``config.json`` in the run folder. Only the
keys named by ``OTEL_TUNIX_RESOURCE_CONFIG_KEYS`` (none by default) also go on the run's OTel
resource as ``tunix.config.<key>`` (scalars; nested dicts flattened with dots): the resource
travels with every export and becomes Prometheus ``target_info`` labels, so a config is not
broadcast unless asked. The values of secret-looking keys (``api_key``, ``wandb_token``, ...:
:func:`otel_tunix.settings.redact.is_secret_key`) are redacted in both. The resource is made by
``configure()``: values set before it (with :func:`set_config`) are on it; values set after
it go to ``config.json`` only.

A config is checked when it is given: keys that are not strings are written as their
``str`` (``{1: "a"}`` becomes ``{"1": "a"}``); a config that contains itself (a cycle) or is
nested deeper than :data:`MAX_DEPTH` levels is refused, naming the setting and the key
(``ConfigurationError`` from ``configure()``, ``ValueError`` from ``set_config()``).
"""

from __future__ import annotations

import fnmatch
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from otel_tunix.recording.current_run import get_current
from otel_tunix.settings.parsing import ConfigurationError
from otel_tunix.settings.redact import REDACTED, is_secret_key, redact_mapping
from otel_tunix.support.linefile import replace_file

__all__ = ["CONFIG_FILE", "config_attributes", "set_config", "take_pending", "write_config"]

CONFIG_FILE = "config.json"
PREFIX = "tunix.config."
MAX_DEPTH = 64
"""The deepest a config's mappings and lists may nest."""

_lock = threading.Lock()
_pending: dict[str, Any] = {}  # set before configure(): taken by the next run
_by_run: dict[str, dict[str, Any]] = {}  # run id -> its config so far


def _checked(
    value: Any,
    where: str,
    error: type[ValueError],
    path: tuple[str, ...] = (),
    seen: tuple[int, ...] = (),
) -> Any:
    """``value`` with string keys at every depth (see the module docstring)."""
    if not isinstance(value, Mapping | list | tuple):
        return value
    name = ".".join(path) or "its top"
    if id(value) in seen:
        raise error(f"{where}: the value at {name!r} contains itself (a cycle)")
    if len(path) >= MAX_DEPTH:
        raise error(f"{where}: nested deeper than {MAX_DEPTH} levels (at {name[:200]!r})")
    inner = (*seen, id(value))
    if isinstance(value, Mapping):
        return {str(k): _checked(v, where, error, (*path, str(k)), inner) for k, v in value.items()}
    items = [_checked(v, where, error, (*path, f"[{i}]"), inner) for i, v in enumerate(value)]
    return items if isinstance(value, list) else tuple(items)


def _flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def config_attributes(
    config: Mapping[str, Any], allowed: tuple[str, ...] | None
) -> dict[str, bool | int | float | str]:
    """``tunix.config.<key>`` resource attributes of the scalar values of ``config`` whose
    (dotted) key matches a pattern of ``allowed`` (``OTEL_TUNIX_RESOURCE_CONFIG_KEYS``;
    ``None``: none); lists, ``None`` and objects left out, secret-looking keys redacted."""
    out: dict[str, bool | int | float | str] = {}
    if not allowed:
        return out
    for key, value in _flat(redact_mapping(config, count=False)).items():
        if not any(fnmatch.fnmatchcase(key, pattern) for pattern in allowed):
            continue
        if (isinstance(value, str) and value == REDACTED) or is_secret_key(key):
            out[PREFIX + key] = REDACTED
        elif isinstance(value, bool | int | float | str):
            out[PREFIX + key] = value
        elif hasattr(value, "item") and getattr(value, "size", 1) == 1:  # numpy / torch
            out[PREFIX + key] = value.item()
    return out


def write_config(path: Path, config: Mapping[str, Any], *, count: bool = True) -> None:
    """Write ``config`` as JSON (values that JSON lacks as their ``str``; secret-looking
    keys' values redacted, counted unless ``count`` is false), atomically."""
    text = json.dumps(redact_mapping(config, count=count), indent=2, sort_keys=True, default=str)
    replace_file(path, text + "\n")


def take_pending(run_id: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config of a new run: what :func:`set_config` kept before it, then ``given``."""
    if given is not None and not isinstance(given, Mapping):
        raise ConfigurationError(f"run_config must be a dict, got a {type(given).__name__}")
    if given is not None:
        given = _checked(given, "run_config", ConfigurationError)
    with _lock:
        config = {**_pending, **(given or {})}
        _pending.clear()
        _by_run.clear()
        _by_run[run_id] = config
    return dict(config)


def set_config(values: Mapping[str, Any] | None = None, /, **more: Any) -> dict[str, Any]:
    """Add hyperparameters to the run's config (``set_config({"lr": 3e-4}, batch=16)``).

    Before ``configure()`` they are kept for the next run (the keys that
    ``OTEL_TUNIX_RESOURCE_CONFIG_KEYS`` names also go on its resource); after
    it they are merged into the run folder's ``config.json``.

    Returns:
        The run's whole config so far.
    """
    if values is not None and not isinstance(values, Mapping):
        raise TypeError(f"set_config() takes a dict, got a {type(values).__name__}")
    new = _checked({**(values or {}), **more}, "set_config()", ValueError)
    run = get_current()
    with _lock:
        if run is None:
            _pending.update(new)
            return dict(_pending)
        config = _by_run.setdefault(run.info.run_id, {})
        config.update(new)
        snapshot = dict(config)
    if run.info.output_dir is not None:
        redact_mapping(new)  # counts the new values' secrets; the file's others were counted
        write_config(run.info.output_dir / CONFIG_FILE, snapshot, count=False)
    return snapshot
