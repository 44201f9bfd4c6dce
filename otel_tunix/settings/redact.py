"""Redaction of secrets: one place for every message, notice and file that could carry one.

What is a secret here:

* the value of a key that looks like one: a word of the key (split at ``_ - . /`` and
  camelCase) is ``key``, ``token``, ``secret``, ``password``, ``passwd``, ``credential(s)``,
  ``auth``, ``authorization``, ``pat`` (``github_pat``) or ``cookie`` (``session_cookie``),
  or ends in one of them (``apikey``, ``accesstoken``); ``max_tokens`` or ``monkey`` are not;
* in a URL, the user info (``http://user:pw@host``, a DSN such as
  ``postgres://user:pw@host/db``) and the query (``?token=...``);
* the values of headers (``OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer x,...``);
* in a config (:func:`redact_mapping`), at any depth of mappings and lists: the values above,
  the secrets inside its strings (:func:`redact_text`: ``--hf_token=...`` in an argv list,
  a DSN), and in a list, the item after a secret-looking flag (``["--hf_token", "hf_x"]``).

Each redaction is counted (``secrets_redacted`` in ``summary.json``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from otel_tunix.settings import tally as _tally

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "is_secret_key",
    "redact_headers",
    "redact_mapping",
    "redact_setting",
    "redact_text",
    "redact_url",
]

REDACTED = "[REDACTED]"
_WORDS = frozenset(
    (
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "apikey",
        "pwd",
        "pat",
        "cookie",
        "cookies",
    )
)
_ENDINGS = (
    "apikey",
    "accesskey",
    "secretkey",
    "privatekey",
    "token",
    "secret",
    "password",
    "cookie",
)
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.\-]*://)([^\s/?#@]*@)?([^\s?#]*)(\?[^\s#'\"]*)?")
_BARE_USERINFO = re.compile(r"(?<![\w/:@.\-])[^\s/:@'\"]+:[^\s/@'\"]+@")  # user:pw@host
_BARE_QUERY = re.compile(r"(?<![\w:/.\-])(/[^\s?#'\"]*)\?([^\s#'\")]+)")
"""A path's query without its scheme and host (``url: /v1/traces?sig=...``: the requests
library's errors quote it so)."""
_PAIR = re.compile(r"([A-Za-z0-9_.\-]+)\s*([=:])\s*([^\s,;&]+)")


def is_secret_key(key: object) -> bool:
    """Whether the value under ``key`` looks like a secret (see the module docstring)."""
    if not isinstance(key, str):
        return False
    for word in _SPLIT.split(key):
        w = word.lower()
        if w in _WORDS or (len(w) > 5 and w.endswith(_ENDINGS)):
            return True
    return False


def redact_mapping(values: Mapping[Any, Any], *, count: bool = True) -> dict[Any, Any]:
    """A copy of ``values`` (nested mappings and lists too) whose secret-looking keys hold
    :data:`REDACTED` and whose strings have their secrets redacted (each counted, unless
    ``count`` is false: the same values redacted again for another destination). The
    caller bounds the depth (:mod:`otel_tunix.run.run_config` checks a config first)."""
    out: dict[Any, Any] = {}
    for key, value in values.items():
        if is_secret_key(key) and value is not None:
            out[key] = REDACTED
            if count:
                _tally.add("secrets_redacted")
        else:
            out[key] = _redact_value(value, count)
    return out


def _redact_value(value: Any, count: bool) -> Any:
    if isinstance(value, str):
        return redact_text(value, count=count)
    if isinstance(value, Mapping):
        return redact_mapping(value, count=count)
    if isinstance(value, list | tuple):
        items: list[Any] = []
        after_flag = False  # ["--hf_token", "hf_x"]: the flag's value is the next item
        for item in value:
            if after_flag and isinstance(item, str) and not item.startswith("-"):
                items.append(REDACTED)
                if count:
                    _tally.add("secrets_redacted")
                after_flag = False
                continue
            after_flag = (
                isinstance(item, str)
                and item.startswith("-")
                and "=" not in item
                and is_secret_key(item)
            )
            items.append(_redact_value(item, count))
        return items if isinstance(value, list) else tuple(items)
    return value


def redact_url(url: str, *, count: bool = True) -> str:
    """``url`` without its user info and query (each replaced by :data:`REDACTED`; counted
    unless ``count`` is false)."""
    return _URL.sub(lambda m: _url_match(m, count), url)


def _add(count: bool) -> None:
    if count:
        _tally.add("secrets_redacted")


def _url_match(m: re.Match[str], count: bool = True) -> str:
    scheme, userinfo, rest, query = m.group(1), m.group(2), m.group(3), m.group(4)
    if userinfo:
        _add(count)
    if query and query != "?":
        _add(count)
    return (
        scheme
        + (f"{REDACTED}@" if userinfo else "")
        + rest
        + (f"?{REDACTED}" if query and query != "?" else "")
    )


def redact_headers(headers: str) -> str:
    """``k1=v1,k2=v2`` (the ``OTEL_EXPORTER_OTLP_HEADERS`` form) with every value redacted."""
    parts = []
    for part in headers.split(","):
        key, sep, value = part.partition("=")
        if sep and value.strip():
            _tally.add("secrets_redacted")
            parts.append(f"{key}={REDACTED}")
        else:
            parts.append(part)
    return ",".join(parts)


def redact_text(text: str, *, count: bool = True) -> str:
    """A message with the secrets it may hold redacted: URLs' user info and queries, and
    the values of ``key=value`` / ``key: value`` pairs whose key looks like a secret
    (``--hf_token=...``); each counted unless ``count`` is false."""
    text = redact_url(text, count=count)
    # an endpoint given without its scheme
    text = _BARE_USERINFO.sub(lambda m: _bare_match(m, count), text)
    text = _BARE_QUERY.sub(lambda m: _bare_query_match(m, count), text)
    return _PAIR.sub(lambda m: _pair_match(m, count), text)


def _bare_query_match(m: re.Match[str], count: bool) -> str:
    if m.group(2) == REDACTED:
        return m.group(0)
    _add(count)
    return f"{m.group(1)}?{REDACTED}"


def _bare_match(m: re.Match[str], count: bool) -> str:
    _add(count)
    return f"{REDACTED}@"


def _pair_match(m: re.Match[str], count: bool) -> str:
    key, sep, value = m.group(1), m.group(2), m.group(3)
    if value == REDACTED or not is_secret_key(key):
        return m.group(0)
    _add(count)
    return f"{key}{sep}{REDACTED}"


def redact_setting(name: str, raw: str) -> str:
    """The value of the variable ``name`` as a message may show it: headers' values and
    any secret-looking variable's value redacted, URLs without user info or query."""
    if "HEADERS" in name or is_secret_key(name.replace("OTEL_", "")):
        return redact_headers(raw) if "HEADERS" in name else REDACTED
    return redact_text(raw)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the message of every record it sees
    (:func:`redact_text`): put on the OTel exporters' loggers, whose retry and failure
    messages quote endpoints and request URLs (their queries, user info) as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not format: left to its handler
            return True
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
