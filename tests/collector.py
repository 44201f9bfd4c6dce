"""A real OpenTelemetry collector for tests: rotel, started on free loopback ports.

:class:`RotelCollector` runs the ``rotel-agent`` binary bundled in the ``rotel`` wheel as a
child process, with its stdout (the debug log of everything it receives) going to a file.
:func:`parse_debug_output` turns that debug log, whose layout is the one of the OTel
Collector's ``debug`` exporter at ``detailed`` verbosity, into :class:`DebugSpan` and
:class:`DebugMetric` objects. :func:`parse_datadog_trace_payload` decodes what rotel's
``datadog`` exporter POSTs (a gzip'd ``AgentPayload`` protobuf) without a Datadog library.

The fixtures in ``conftest.py`` (``rotel_collector``, ``rotel_factory``) wrap this module.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import importlib.util
import math
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 15.0

DEBUG_ARGS: tuple[str, ...] = (
    "--exporter",
    "blackhole",
    "--debug-log",
    "traces",
    "--debug-log",
    "metrics",
    "--debug-log-verbosity",
    "detailed",
)
"""Default rotel arguments: drop everything, but print every span and metric received."""


def rotel_agent_path() -> Path:
    """Returns the ``rotel-agent`` binary shipped inside the installed ``rotel`` package."""
    spec = importlib.util.find_spec("rotel")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the 'rotel' package is not installed (it is in the dev extra)")
    path = Path(next(iter(spec.submodule_search_locations))) / "rotel-agent"
    if not path.is_file():
        raise RuntimeError(f"rotel is installed but its binary is missing: {path}")
    return path


def free_port() -> int:
    """Returns a TCP port on loopback that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_accepts(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts TCP connections on ``host:port`` right now."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def read_env_file(path: Path) -> dict[str, str]:
    """Reads ``KEY=VALUE`` lines (``#`` comments and blank lines skipped), like
    ``docker run --env-file`` and ``set -a; . file``."""
    env: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        env[key] = value
    return env


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RotelCollector:
    """One ``rotel-agent`` process listening for OTLP on loopback.

    Args:
        log_path: File that receives the agent's stdout and stderr (appended to across
            restarts).
        args: Arguments after ``rotel-agent start`` other than the two listen endpoints.
            Default: :data:`DEBUG_ARGS` (blackhole exporter, detailed debug log).
        env: Extra environment for the agent (``ROTEL_*`` settings, e.g. from an env
            file). ``ROTEL_*`` variables of the test process itself are not inherited.
        grpc_port: OTLP/gRPC port; ``None`` picks a free one.
        http_port: OTLP/HTTP port; ``None`` picks a free one.
    """

    def __init__(
        self,
        log_path: Path,
        *,
        args: Sequence[str] = DEBUG_ARGS,
        env: Mapping[str, str] | None = None,
        grpc_port: int | None = None,
        http_port: int | None = None,
    ) -> None:
        self.log_path = Path(log_path)
        self.args = list(args)
        self.env = dict(env or {})
        self._pinned_ports = grpc_port is not None or http_port is not None
        self.grpc_port = grpc_port if grpc_port is not None else free_port()
        self.http_port = http_port if http_port is not None else free_port()
        self._process: subprocess.Popen[bytes] | None = None

    # -- addresses ---------------------------------------------------------------------

    @property
    def grpc_endpoint(self) -> str:
        """``http://127.0.0.1:<grpc port>``, for the OTLP gRPC exporters."""
        return f"http://{LOOPBACK}:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """``http://127.0.0.1:<http port>``; add ``/v1/traces`` or ``/v1/metrics``."""
        return f"http://{LOOPBACK}:{self.http_port}"

    @property
    def pid(self) -> int | None:
        """Process id of the running agent, ``None`` when stopped."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the agent process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def command(self) -> list[str]:
        """The full command line the agent is started with."""
        return [
            str(rotel_agent_path()),
            "start",
            "--otlp-grpc-endpoint",
            f"{LOOPBACK}:{self.grpc_port}",
            "--otlp-http-endpoint",
            f"{LOOPBACK}:{self.http_port}",
            *self.args,
        ]

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> RotelCollector:
        """Starts the agent and waits until both ports accept connections.

        Free ports picked by this object are re-picked if the agent loses the race for
        them; pinned ports (given to the constructor, or kept by :meth:`restart`) are
        retried until ``timeout``.

        Raises:
            RuntimeError: The agent exited or did not listen within ``timeout``; the
                message holds its output.
        """
        if self.running:
            raise RuntimeError(f"rotel is already running (pid {self.pid})")
        deadline = time.monotonic() + timeout
        while True:
            self._spawn()
            failure = self._wait_listening(deadline)
            if failure is None:
                return self
            self._terminate()
            in_use = "in use" in self.output()[-2000:].lower()
            if in_use and time.monotonic() < deadline:
                if not self._pinned_ports:
                    self.grpc_port, self.http_port = free_port(), free_port()
                time.sleep(0.1)
                continue
            raise RuntimeError(
                f"rotel did not start ({failure}); command: {' '.join(self.command)}\n"
                f"--- output ({self.log_path}) ---\n{self.output()[-4000:]}"
            )

    def stop(self, timeout: float = 5.0) -> None:
        """Stops the agent by pid: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        self._terminate(timeout)

    def kill(self) -> None:
        """Kills the agent at once (SIGKILL), like a crashed collector."""
        if self.running:
            assert self._process is not None
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=5)

    def restart(self, timeout: float = START_TIMEOUT_S) -> RotelCollector:
        """Stops the agent and starts it again on the same ports."""
        self.stop()
        self._pinned_ports = True
        return self.start(timeout)

    def __enter__(self) -> RotelCollector:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _spawn(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROTEL_")}
        env.update({"NO_COLOR": "1", "RUST_BACKTRACE": "1"})
        env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Append mode: output survives restarts, and a writer never leaves a hole of NULs.
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def _wait_listening(self, deadline: float) -> str | None:
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                return f"exited with code {self._process.returncode}"
            if port_accepts(self.grpc_port) and port_accepts(self.http_port):
                # A port held by another process also accepts: make sure the agent lives on.
                time.sleep(0.05)
                if self._process.poll() is None:
                    return None
                continue
            time.sleep(0.02)
        return "its ports did not accept connections in time"

    def _terminate(self, timeout: float = 5.0) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        else:
            process.wait()

    # -- output ------------------------------------------------------------------------

    def output(self) -> str:
        """Everything the agent printed so far (all runs), colour codes removed."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        return _ANSI.sub("", data.decode("utf-8", errors="replace"))

    def parsed(self) -> DebugOutput:
        """The spans and metrics of :meth:`output`."""
        return parse_debug_output(self.output())

    def wait_for(self, predicate: str | Callable[[str], Any], timeout: float = 10.0) -> str:
        """Waits until the output contains a substring or satisfies a predicate.

        Args:
            predicate: A substring, or a callable that receives the output text and
                returns something truthy when the wait is over.
            timeout: Seconds to wait.

        Returns:
            The output text that satisfied the predicate.

        Raises:
            TimeoutError: Not satisfied in time; the message holds the output's tail.
        """
        if isinstance(predicate, str):
            needle = predicate

            def check(text: str) -> bool:
                return needle in text

        else:
            check = predicate
        deadline = time.monotonic() + timeout
        while True:
            text = self.output()
            if check(text):
                return text
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"rotel output did not satisfy {predicate!r} within {timeout}s "
                    f"(running={self.running})\n--- output tail ---\n{text[-4000:]}"
                )
            time.sleep(0.05)

    def wait_for_spans(self, *names: str, timeout: float = 10.0) -> DebugOutput:
        """Waits until a span of each name was received; returns the parsed output."""
        return self.wait_for_span_counts(dict.fromkeys(names, 1), timeout=timeout)

    def wait_for_span_counts(self, counts: Mapping[str, int], timeout: float = 10.0) -> DebugOutput:
        """Waits until at least ``counts[name]`` spans of each name were received; returns
        the parsed output."""

        def seen(text: str) -> bool:
            got = parse_debug_output(text)
            return all(len(got.spans_named(n)) >= c for n, c in counts.items())

        return parse_debug_output(self.wait_for(seen, timeout))

    def wait_for_metrics(self, *names: str, timeout: float = 10.0) -> DebugOutput:
        """Waits until a metric of each name was received; returns the parsed output."""

        def seen(text: str) -> bool:
            got = {m.name for m in parse_debug_output(text).metrics}
            return all(n in got for n in names)

        return parse_debug_output(self.wait_for(seen, timeout))

    def __repr__(self) -> str:
        return (
            f"RotelCollector(grpc={self.grpc_endpoint}, http={self.http_endpoint}, pid={self.pid})"
        )


# ----------------------------------------------------------------------------------------
# Debug-log parser
# ----------------------------------------------------------------------------------------

AttributeValue = Any


@dataclass
class DebugEvent:
    """A span event."""

    name: str = ""
    timestamp_ns: int = 0
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass
class DebugLink:
    """A span link."""

    trace_id: str = ""
    span_id: str = ""
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass
class DebugSpan:
    """A span as printed by the collector. Ids are lowercase hex; a root's parent is None."""

    name: str = ""
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str | None = None
    kind: str = ""
    status_code: str = ""
    status_message: str = ""
    start_ns: int = 0
    end_ns: int = 0
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    resource: dict[str, AttributeValue] = field(default_factory=dict)
    scope_name: str = ""
    scope_version: str = ""
    events: list[DebugEvent] = field(default_factory=list)
    links: list[DebugLink] = field(default_factory=list)


@dataclass
class DebugExemplar:
    """An exemplar of a data point: the measurement and the span it was recorded in."""

    trace_id: str = ""
    span_id: str = ""
    time_ns: int = 0
    value: float | None = None


@dataclass
class DebugDataPoint:
    """A number or histogram data point. Bucket counts are per bucket (not cumulative)."""

    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    start_ns: int = 0
    time_ns: int = 0
    value: float | None = None
    count: int | None = None
    sum: float | None = None
    min: float | None = None
    max: float | None = None
    explicit_bounds: list[float] = field(default_factory=list)
    bucket_counts: list[int] = field(default_factory=list)
    exemplars: list[DebugExemplar] = field(default_factory=list)


@dataclass
class DebugMetric:
    """A metric as printed by the collector."""

    name: str = ""
    description: str = ""
    unit: str = ""
    data_type: str = ""
    is_monotonic: bool | None = None
    temporality: str = ""
    resource: dict[str, AttributeValue] = field(default_factory=dict)
    scope_name: str = ""
    scope_version: str = ""
    points: list[DebugDataPoint] = field(default_factory=list)


@dataclass
class DebugOutput:
    """Everything parsed from a debug log, in the order received."""

    spans: list[DebugSpan] = field(default_factory=list)
    metrics: list[DebugMetric] = field(default_factory=list)

    def spans_named(self, name: str) -> list[DebugSpan]:
        """All spans with this name."""
        return [s for s in self.spans if s.name == name]

    def span(self, name: str) -> DebugSpan:
        """The single span with this name (AssertionError if none or several)."""
        found = self.spans_named(name)
        assert len(found) == 1, f"expected one span {name!r}, got {len(found)}"
        return found[0]

    def children(self, parent: DebugSpan) -> list[DebugSpan]:
        """Spans whose parent is ``parent``."""
        return [
            s
            for s in self.spans
            if s.trace_id == parent.trace_id and s.parent_span_id == parent.span_id
        ]

    def metrics_named(self, name: str) -> list[DebugMetric]:
        """Every received copy of this metric (one per export)."""
        return [m for m in self.metrics if m.name == name]

    def metric(self, name: str) -> DebugMetric:
        """The most recently received copy of this metric (KeyError if none)."""
        found = self.metrics_named(name)
        if not found:
            raise KeyError(f"no metric {name!r}; got {sorted({m.name for m in self.metrics})}")
        return found[-1]


# Lines that start a structure in the debug layout; any other line continues the line
# before it (a string attribute value containing a newline).
_STRUCTURAL = re.compile(
    r"""^(?:
        \d{4}-\d\d-\d\dT                     # rotel's own log lines
      | Resource(?:Spans|Metrics|Logs)\ \#
      | Resource\ (?:SchemaURL|attributes)
      | Scope(?:Spans|Metrics|Logs)\ (?:\#|SchemaURL)
      | InstrumentationScope\b
      | Span\ \# | SpanEvent\ \# | SpanLink\ \# | LogRecord\ \#
      | (?:Attributes|Events|Links|Descriptor|Data\ point\ attributes):
      | (?:Start\ time|End\ time|StartTimestamp|Timestamp|ObservedTimestamp|Count|Sum|Min|Max
          |Value|Scale|ZeroCount|Flags):
      | Metric\ \#
      | \w*DataPoints\ \#
      | ExplicitBounds\ \# | Buckets\ \# | Exemplars: | Exemplar\ \#
      | \s+(?:Trace\ ID|Parent\ ID|ID|Name|Kind|Status\ code|Status\ message)\s+:
      | \s+->[ ]
      | Error:|error:|thread\ '
    )""",
    re.VERBOSE,
)
_ARROW = re.compile(r"^(\s+)-> (.*)$", re.DOTALL)
_TYPED = re.compile(r"^(?P<key>.*?): (?P<type>\w+)\((?P<value>.*)\)$", re.DOTALL)
_FIELD = re.compile(r"^\s+(Trace ID|Parent ID|ID|Name|Kind|Status code|Status message)\s+: ?(.*)$")


def _logical_lines(text: str) -> Iterator[str]:
    pending: str | None = None
    for line in _ANSI.sub("", text).replace("\x00", "").splitlines():
        if pending is not None and not _STRUCTURAL.match(line):
            pending += "\n" + line
            continue
        if pending is not None:
            yield pending
        pending = line
    if pending is not None:
        yield pending


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def parse_attribute_value(kind: str, raw: str) -> AttributeValue:
    """Converts a printed value such as ``Int(3)`` (given as ``"Int", "3"``) to Python.

    ``Str`` -> str, ``Int`` -> int, ``Double`` -> float, ``Bool`` -> bool, ``Slice`` ->
    list; ``Map``, ``Bytes`` and unknown kinds stay the raw text; ``Empty`` -> None.
    """
    if kind == "Str":
        return raw
    if kind == "Int":
        return int(raw)
    if kind == "Double":
        return float(raw)
    if kind == "Bool":
        return raw.lower() == "true"
    if kind == "Empty":
        return None
    if kind == "Slice":
        items = []
        for part in _split_top_level(raw):
            m = re.fullmatch(r"(\w+)\((.*)\)", part, re.DOTALL)
            items.append(parse_attribute_value(m.group(1), m.group(2)) if m else part)
        return items
    return raw


def _parse_typed(body: str) -> tuple[str, AttributeValue] | None:
    m = _TYPED.match(body)
    if not m:
        return None
    return m.group("key"), parse_attribute_value(m.group("type"), m.group("value"))


def _number(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:  # a line still being written by the collector
        return math.nan


def parse_debug_output(text: str) -> DebugOutput:
    """Parses a collector debug log (``detailed`` verbosity) into spans and metrics.

    Logs (``ResourceLogs``) are skipped. Partial blocks at the end of a log still being
    written are parsed as far as they go.
    """
    out = DebugOutput()
    resource: dict[str, AttributeValue] = {}
    scope = ("", "")
    section = ""
    span: DebugSpan | None = None
    event: DebugEvent | None = None
    link: DebugLink | None = None
    metric: DebugMetric | None = None
    point: DebugDataPoint | None = None
    signal_kind = ""

    for line in _logical_lines(text):
        stripped = line.strip()
        if re.match(r"^Resource(Spans|Metrics|Logs) #", line):
            signal_kind = line.split()[0]
            resource, scope, section = {}, ("", ""), "resource"
            span = event = link = metric = point = None
            continue
        if signal_kind == "ResourceLogs" or not signal_kind:
            continue
        if line.startswith("Resource attributes:"):
            section = "resource_attrs"
            continue
        if line.startswith("InstrumentationScope"):
            parts = stripped.split(" ", 2)
            scope = (parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else "")
            section = ""
            continue
        if re.match(r"^Scope(Spans|Metrics) #", line):
            scope, section = ("", ""), ""
            continue
        if line.startswith("Span #"):
            span = DebugSpan(resource=dict(resource), scope_name=scope[0], scope_version=scope[1])
            out.spans.append(span)
            section, event, link = "span", None, None
            continue
        if line.startswith("Metric #"):
            metric = DebugMetric(
                resource=dict(resource), scope_name=scope[0], scope_version=scope[1]
            )
            out.metrics.append(metric)
            section, point = "metric", None
            continue

        arrow = _ARROW.match(line)
        if arrow and section == "exemplar" and point is not None and point.exemplars:
            _set_exemplar_field(point.exemplars[-1], arrow.group(2))
            continue
        if arrow:
            indent, body = len(arrow.group(1)), arrow.group(2)
            _apply_arrow(section, indent, body, resource, span, event, link, metric, point)
            continue

        if span is not None and signal_kind == "ResourceSpans":
            field_match = _FIELD.match(line)
            if field_match:
                _set_span_field(span, field_match.group(1), field_match.group(2).strip())
                continue
            if line.startswith("Start time:"):
                span.start_ns = int(_number(line.split(":", 1)[1]))
            elif line.startswith("End time:"):
                span.end_ns = int(_number(line.split(":", 1)[1]))
            elif line.startswith("Attributes:"):
                section = "span_attrs"
            elif line.startswith("Events:"):
                section = "events"
            elif line.startswith("SpanEvent #"):
                event, section = DebugEvent(), "event"
                span.events.append(event)
            elif line.startswith("Links:"):
                section = "links"
            elif line.startswith("SpanLink #"):
                link, section = DebugLink(), "link"
                span.links.append(link)
            continue

        if metric is not None and signal_kind == "ResourceMetrics":
            if line.startswith("Descriptor:"):
                section = "descriptor"
            elif re.match(r"^\w*DataPoints #", line):
                point, section = DebugDataPoint(), "point"
                metric.points.append(point)
            elif line.startswith("Exemplar #") and point is not None:
                point.exemplars.append(DebugExemplar())
                section = "exemplar"
            elif line.startswith("Exemplars:"):
                continue
            elif point is not None:
                _set_point_field(point, line)
                if line.startswith("Data point attributes:"):
                    section = "point_attrs"
    return out


def _set_span_field(span: DebugSpan, name: str, value: str) -> None:
    if name == "Trace ID":
        span.trace_id = value.lower()
    elif name == "Parent ID":
        span.parent_span_id = value.lower() or None
    elif name == "ID":
        span.span_id = value.lower()
    elif name == "Name":
        span.name = value
    elif name == "Kind":
        span.kind = value
    elif name == "Status code":
        span.status_code = value
    elif name == "Status message":
        span.status_message = value


def _set_exemplar_field(exemplar: DebugExemplar, body: str) -> None:
    key, _, value = body.partition(":")
    value = value.strip()
    if key == "Trace ID":
        exemplar.trace_id = value.lower()
    elif key == "Span ID":
        exemplar.span_id = value.lower()
    elif key == "Timestamp":
        exemplar.time_ns = int(value)
    elif key == "Value":
        exemplar.value = _number(value)


def _set_point_field(point: DebugDataPoint, line: str) -> None:
    key, sep, value = line.partition(":")
    if not sep:
        return
    value = value.strip()
    if key == "StartTimestamp":
        point.start_ns = int(value)
    elif key == "Timestamp":
        point.time_ns = int(value)
    elif key == "Value":
        point.value = _number(value)
    elif key == "Count":
        point.count = int(_number(value))
    elif key == "Sum":
        point.sum = _number(value)
    elif key == "Min":
        point.min = _number(value)
    elif key == "Max":
        point.max = _number(value)
    elif key.startswith("ExplicitBounds #"):
        point.explicit_bounds.append(_number(value))
    elif key.startswith("Buckets #"):
        # "Buckets #3, Count: 5"
        point.bucket_counts.append(int(_number(line.rsplit(":", 1)[1])))


def _apply_arrow(
    section: str,
    indent: int,
    body: str,
    resource: dict[str, AttributeValue],
    span: DebugSpan | None,
    event: DebugEvent | None,
    link: DebugLink | None,
    metric: DebugMetric | None,
    point: DebugDataPoint | None,
) -> None:
    if section == "resource_attrs":
        parsed = _parse_typed(body)
        if parsed:
            resource[parsed[0]] = parsed[1]
    elif section == "span_attrs" and span is not None:
        parsed = _parse_typed(body)
        if parsed:
            span.attributes[parsed[0]] = parsed[1]
    elif section in ("event", "link"):
        target = event if section == "event" else link
        if target is None:
            return
        if indent > 5:  # the nested "-> Attributes::" block
            parsed = _parse_typed(body)
            if parsed:
                target.attributes[parsed[0]] = parsed[1]
            return
        key, _, value = body.partition(": ")
        if isinstance(target, DebugEvent):
            if key == "Name":
                target.name = value
            elif key == "Timestamp":
                target.timestamp_ns = int(value or 0)
        elif key == "Trace ID":
            target.trace_id = value.lower()
        elif key == "ID":
            target.span_id = value.lower()
    elif section == "descriptor" and metric is not None:
        key, _, value = body.partition(":")
        value = value.strip()
        if key == "Name":
            metric.name = value
        elif key == "Description":
            metric.description = value
        elif key == "Unit":
            metric.unit = value
        elif key == "DataType":
            metric.data_type = value
        elif key == "IsMonotonic":
            metric.is_monotonic = value.lower() == "true"
        elif key == "AggregationTemporality":
            metric.temporality = value
    elif section == "point_attrs" and point is not None:
        parsed = _parse_typed(body)
        if parsed:
            point.attributes[parsed[0]] = parsed[1]


# ----------------------------------------------------------------------------------------
# Datadog trace payload (what rotel's datadog exporter POSTs to /api/v0.2/traces)
# ----------------------------------------------------------------------------------------


@dataclass
class DatadogSpan:
    """A span in Datadog's format (``datadog.trace.Span``); ids are unsigned 64-bit."""

    service: str = ""
    name: str = ""
    resource: str = ""
    trace_id: int = 0
    span_id: int = 0
    parent_id: int = 0
    start_ns: int = 0
    duration_ns: int = 0
    error: int = 0
    meta: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    type: str = ""


def _varint(data: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, i


def _proto_fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """Yields (field number, wire type, value) of a protobuf message, without a schema."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = data[i : i + 8], i + 8
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i : i + size], i + size
        elif wire == 5:
            value, i = data[i : i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _map_entry(data: bytes) -> tuple[str, Any]:
    key: str = ""
    value: Any = None
    for number, wire, raw in _proto_fields(data):
        if number == 1:
            key = raw.decode()
        elif number == 2:
            value = struct.unpack("<d", raw)[0] if wire == 1 else raw.decode()
    return key, value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _datadog_span(data: bytes) -> DatadogSpan:
    span = DatadogSpan()
    for number, _, value in _proto_fields(data):
        match number:
            case 1:
                span.service = value.decode()
            case 2:
                span.name = value.decode()
            case 3:
                span.resource = value.decode()
            case 4:
                span.trace_id = value
            case 5:
                span.span_id = value
            case 6:
                span.parent_id = value
            case 7:
                span.start_ns = _signed64(value)
            case 8:
                span.duration_ns = _signed64(value)
            case 9:
                span.error = value
            case 10:
                key, text = _map_entry(value)
                span.meta[key] = text
            case 11:
                key, number_value = _map_entry(value)
                span.metrics[key] = number_value
            case 12:
                span.type = value.decode()
    return span


def parse_datadog_trace_payload(body: bytes) -> list[DatadogSpan]:
    """Decodes an ``AgentPayload`` (gzip'd or not) into its spans.

    Field numbers from Datadog's public ``agent_payload.proto`` / ``tracer_payload.proto``
    / ``span.proto``: AgentPayload.tracerPayloads = 5, TracerPayload.chunks = 6,
    TraceChunk.spans = 3.
    """
    if body[:2] == b"\x1f\x8b":
        body = gzip.decompress(body)
    spans: list[DatadogSpan] = []
    for number, _, tracer_payload in _proto_fields(body):
        if number != 5:
            continue
        for tp_number, _, chunk in _proto_fields(tracer_payload):
            if tp_number != 6:
                continue
            for chunk_number, _, span_bytes in _proto_fields(chunk):
                if chunk_number == 3:
                    spans.append(_datadog_span(span_bytes))
    return spans


class FakeDatadogIntake:
    """A loopback HTTP server that records every POST, standing in for Datadog's intake.

    Use as a context manager; point rotel's ``--datadog-exporter-custom-endpoint`` (or
    ``ROTEL_EXPORTER_<NAME>_CUSTOM_ENDPOINT``) at :attr:`url`.
    """

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.arrived = threading.Event()
        intake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                intake.requests.append((self.path, headers, body))
                intake.arrived.set()
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{LOOPBACK}:{self._server.server_port}"

    def spans(self) -> list[DatadogSpan]:
        """The spans of every trace payload received so far."""
        return [
            span
            for path, _, body in list(self.requests)
            if path.endswith("/traces")
            for span in parse_datadog_trace_payload(body)
        ]

    def wait_for_spans(self, *resources: str, timeout: float = 15.0) -> list[DatadogSpan]:
        """Waits until spans with these resource names (OTel span names) arrived."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if all(r in {s.resource for s in spans} for r in resources):
                return spans
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no Datadog spans {resources} within {timeout}s; "
                    f"requests: {[(p, len(b)) for p, _, b in self.requests]}"
                )
            time.sleep(0.05)

    def __enter__(self) -> FakeDatadogIntake:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
