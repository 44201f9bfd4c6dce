"""Tunix's perf tracer protocol (v1 and v2) recorded as otel-tunix steps and components:
:class:`OTelPerfTracer`. Re-exported by :mod:`otel_tunix.instrumentation.tunix`.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import otel_tunix
from otel_tunix.instrumentation import _base
from otel_tunix.instrumentation._base import step_is_open
from otel_tunix.instrumentation._tunix_perf import LEARNER_SCOPE, LearnerExport, MetricsT
from otel_tunix.instrumentation.jax import device_end
from otel_tunix.support.errors import report_internal_error, warn_once

_logger = logging.getLogger("otel_tunix.instrumentation.tunix")  # the public module's logger

DEFAULT_STEP_GROUPS: Mapping[str, str] = {"global_step": "rl/learner"}
"""Tunix span groups that open an otel-tunix step, and the step's scope."""

COMPONENT_NAMES: Mapping[str, str] = {
    "refer_inference": "reference_inference",
    "peft_train": "peft_train_step",
}
"""Tunix names one kind of work differently in its v1 and v2 tracers; the component takes
one name for both (the other as given)."""

TAG_ATTRIBUTES: Mapping[str, str] = {
    "step": "tunix.global_step",
    "role": "tunix.role",
    "mini_batch_step": "tunix.mini_batch",
    "micro_batch_step": "tunix.micro_batch",
    "group_id": "tunix.group_id",
    "pair_index": "tunix.pair_index",
}
"""The span attribute of each tag Tunix's v2 tracer gives a span (others become
``tunix.tag.<key>``). Tunix's ``step`` tag is its global step: ``tunix.step`` is already the
otel-tunix step the component belongs to."""


def _set_tags(comp: Any, tags: Mapping[str, Any]) -> None:
    """Tunix's tags as attributes of the component (``None`` values left out)."""
    for key, value in tags.items():
        if value is None:
            continue
        if not isinstance(value, str | bool | int | float):
            item = getattr(value, "item", None)  # a numpy or JAX scalar
            value = item() if callable(item) else str(getattr(value, "value", value))
        comp.set_attribute(TAG_ATTRIBUTES.get(key) or f"tunix.tag.{key}", value)


def _set_step_attributes(step: Any, attributes: Callable[[], Mapping[str, Any]] | None) -> None:
    """``attributes()`` on the step just opened (a framework counter that cannot be read is
    left out, said once)."""
    set_attribute = getattr(step, "set_attribute", None)
    if attributes is None or set_attribute is None:
        return
    try:
        values = attributes()
    except Exception:  # the framework's private counter changed
        warn_once(
            ("tunix", "step-attributes"),
            "otel-tunix: reading a Tunix step attribute failed; left out",
            logger=_logger,
            level=logging.DEBUG,
            exc_info=True,
        )
        return
    for key, value in values.items():
        set_attribute(key, value)


# --- the tracer ----------------------------------------------------------------------------


class _Waitlist:
    """What a tracer span yields: ``device_end(arrays)`` (v1) and ``async_end(arrays)``
    (v2) both add arrays whose readiness ends the span."""

    __slots__ = ("arrays",)

    def __init__(self) -> None:
        self.arrays: list[Any] = []

    def device_end(self, waitlist: Any) -> None:
        """Tunix v1: the span ends when ``waitlist`` (a pytree of arrays) is ready."""
        self.arrays.append(waitlist)

    def async_end(self, waitlist: Any) -> None:
        """Tunix v2: same as :meth:`device_end`."""
        self.arrays.append(waitlist)

    @property
    def waitlist(self) -> list[Any]:
        """The arrays added so far (Tunix v2's ``AsyncWaitlist.waitlist``)."""
        return self.arrays


class _OpenSpan:
    __slots__ = ("api", "component", "owner", "waitlist")

    def __init__(self, owner: _TracerState, api: str, waitlist: _Waitlist, component: Any) -> None:
        self.owner = owner
        self.api = api
        self.waitlist = waitlist
        self.component = component


_innermost: contextvars.ContextVar[_OpenSpan | None] = contextvars.ContextVar(
    "otel_tunix_tunix_span", default=None
)


class _TracerState:
    """What the v1 and v2 faces of one tracer share."""

    def __init__(
        self, scope: str, step_groups: Mapping[str, str], devices: Iterable[Any] | None
    ) -> None:
        self.scope = scope
        self.step_groups = dict(step_groups)
        self.devices: list[str] = [_device_id(d) for d in _flat(devices)]
        self.counters: dict[str, itertools.count[int]] = {}
        self.numbers: dict[str, Callable[[], int]] = {}
        """Per scope, where the number of a step this tracer opens comes from (the
        framework's own counter); else a counter per scope."""
        self.attributes: dict[str, Callable[[], Mapping[str, Any]]] = {}
        """Per scope, attributes read as a step this tracer opens opens."""
        self.lock = threading.Lock()
        self.exports = LearnerExport()

    def next_number(self, scope: str) -> int:
        number = self.numbers.get(scope)
        if number is not None:
            try:
                return int(number())
            except Exception:  # the framework's private counter changed: count instead
                warn_once(
                    ("tunix", "step-number", scope),
                    "otel-tunix: reading the Tunix step number of %r failed; counting instead",
                    scope,
                    logger=_logger,
                    level=logging.DEBUG,
                    exc_info=True,
                )
        with self.lock:
            counter = self.counters.get(scope)
            if counter is None:
                counter = self.counters[scope] = itertools.count()
            return next(counter)

    def note_devices(self, devices: Any) -> None:
        if devices is None:
            return
        for d in _flat(devices):
            did = _device_id(d)
            if did not in self.devices:
                self.devices.append(did)


def _flat(devices: Any) -> list[Any]:
    if devices is None:
        return []
    flat = getattr(devices, "flat", None)  # numpy array of devices (mesh.devices)
    if flat is not None:
        return list(flat)
    return list(devices)


def _device_id(device: Any) -> str:
    if isinstance(device, str):
        return device
    platform, did = getattr(device, "platform", None), getattr(device, "id", None)
    return f"{platform}{did}" if platform is not None and did is not None else str(device)


class OTelPerfTracer:
    """Tunix's perf tracer protocol, recorded as otel-tunix steps and components.

    * ``span(name, devices=None, tags=None)`` is the component ``name`` (one name per kind
      of work: see :data:`COMPONENT_NAMES`), with Tunix's tags as attributes (see
      :data:`TAG_ATTRIBUTES`). Arrays given to the yielded object's ``device_end`` (v1) /
      ``async_end`` (v2) end it on the device. A span opened when no ``otel_tunix.step`` is
      open gets a step of its own in ``scope``, numbered by ``tags["step"]`` when that is an
      int, else by a counter.
    * ``span_group(name)`` opens a step when ``name`` is in ``step_groups``
      (``global_step`` -> ``rl/learner``) and no step is open; otherwise it is a component.
    * ``export()`` returns Tunix's own perf metrics of the last ``rl/learner`` step
      (``perf/global_step_time``, ``perf/sum/rollout_time``, ...), computed from its spans
      once its device work is done (see :mod:`._tunix_perf`); ``{}`` when it was not
      sampled. ``synchronize()``, ``print()`` do nothing (device ends resolve on their own).

    ``tracer`` speaks v1 and ``tracer.v2`` v2; both record into the same steps. A v2 span
    opened directly inside a v1 span of the same tracer (Tunix opens both around one
    computation) is merged into it instead of doubling it. Never raises into Tunix.

    Args:
        devices: Devices to list in ``all_devices`` (others are added as spans name them).
        scope: Scope of the steps that spans open on their own.
        step_groups: ``{group name: scope}`` of span groups that open steps.
    """

    api = "v1"

    def __init__(
        self,
        devices: Iterable[Any] | None = None,
        *,
        scope: str = "train",
        step_groups: Mapping[str, str] = DEFAULT_STEP_GROUPS,
        _state: _TracerState | None = None,
    ) -> None:
        self._state = _state or _TracerState(scope, step_groups, devices)

    @property
    def v2(self) -> OTelPerfTracer:
        """The same tracer, for ``perf_tracer_v2=`` (Tunix's experimental protocol)."""
        if self.api == "v2":
            return self
        return _V2Tracer(_state=self._state)

    @property
    def v1(self) -> OTelPerfTracer:
        """The same tracer, for ``perf_tracer=`` (Tunix's v1 protocol)."""
        if self.api == "v1":
            return self
        return OTelPerfTracer(_state=self._state)

    @property
    def scope(self) -> str:
        """Scope of the steps that spans open when no step is open."""
        return self._state.scope

    @property
    def all_devices(self) -> list[str]:
        """Ids of the devices seen so far (``"cpu0"``, ``"tpu3"``, ...)."""
        return list(self._state.devices)

    def synchronize(self) -> None:
        """Nothing to do: device ends resolve on otel-tunix's waiter thread."""

    def print(self) -> None:
        """Nothing to print: the spans go to otel-tunix's exporters."""

    def export(self) -> MetricsT:
        """Tunix's perf metrics of the last ``rl/learner`` step, from its spans (waits for
        its device work, as Tunix's own export reads finished timelines)."""
        return self._state.exports.metrics()

    def process_and_commit_timelines(self) -> None:
        """Tunix v2 API; nothing to commit."""

    @contextlib.contextmanager
    def span_group(self, name: str) -> Iterator[None]:
        """A Tunix span group: a step (see ``step_groups``) or a component."""
        st = self._state
        scope = st.step_groups.get(name)
        number: int | None = None
        try:
            if scope is not None and not step_is_open():
                _base.ensure_configured()
                number = st.next_number(scope)
                if scope == LEARNER_SCOPE:
                    st.exports.watch()
                cm: Any = otel_tunix.step(number, scope=scope)
            else:
                cm = otel_tunix.component(name)
        except Exception:  # only our own code above
            cm = contextlib.nullcontext()
            report_internal_error("opening a Tunix span group")
        with cm:
            if number is not None and scope is not None:
                _set_step_attributes(cm, st.attributes.get(scope))
            yield
        if scope == LEARNER_SCOPE and number is not None:
            st.exports.closed = number

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        devices: Any = None,
        tags: Mapping[str, Any] | None = None,
    ) -> Iterator[_Waitlist]:
        """A Tunix span: the component ``name``, ending when its waitlist is ready."""
        st = self._state
        outer = _innermost.get()
        if outer is not None and outer.owner is st and outer.api != self.api:
            # ``with tracer.span(a) as s, tracer_v2.span(b) as s2``: one computation.
            if tags and outer.component is not None:
                _set_tags(outer.component, tags)
            yield outer.waitlist
            return
        name = COMPONENT_NAMES.get(name, name)
        waitlist = _Waitlist()
        step_cm: Any = None
        comp: Any = None
        token = None
        try:
            st.note_devices(devices)
        except Exception:  # devices as Tunix gave them, not readable: the span is not recorded
            warn_once(
                (id(st), "devices"),
                "otel-tunix: Tunix span %r: devices not readable",
                name,
                logger=_logger,
                level=logging.DEBUG,
                exc_info=True,
            )
        else:
            try:
                if not step_is_open():
                    _base.ensure_configured()
                    n = tags.get("step") if tags else None
                    if not isinstance(n, int) or isinstance(n, bool):
                        n = st.next_number(st.scope)
                    step_cm = otel_tunix.step(n, scope=st.scope)
                    step_cm.__enter__()
                comp = otel_tunix.component(name)
                comp.__enter__()
                if tags:
                    _set_tags(comp, tags)
                token = _innermost.set(_OpenSpan(st, self.api, waitlist, comp))
            except Exception:  # only our own code above
                report_internal_error("opening a Tunix span")
        try:
            yield waitlist
        except BaseException as exc:  # the traced code's own error: on the span, then raised on
            _close_span(comp, step_cm, token, waitlist, exc)
            raise
        _close_span(comp, step_cm, token, waitlist, None)

    def number_steps(
        self,
        scope: str,
        number: Callable[[], int] | None,
        attributes: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        """Number the steps this tracer opens in ``scope`` by ``number()`` (a framework's
        own counter, read as each step opens), with ``attributes()`` on them; ``None``: by a
        counter again, with no attributes."""
        if number is None:
            self._state.numbers.pop(scope, None)
            self._state.attributes.pop(scope, None)
            return
        self._state.numbers[scope] = number
        if attributes is not None:
            self._state.attributes[scope] = attributes


class _V2Tracer(OTelPerfTracer):
    api = "v2"

    def export(self) -> MetricsT:
        """Nothing: the same tracer's v1 face exports the perf metrics (Tunix logs what
        each face returns)."""
        return {}


class TeeTracer:
    """Tunix's own tracer (one its ``perf_config`` made, or one passed to a trainer) and an
    :class:`OTelPerfTracer`, given the same spans: Tunix keeps its timelines, its Perfetto
    writer and its ``export()``; otel-tunix records its steps and components.

    Everything but ``span`` and ``span_group`` (``export``, ``synchronize``, ``print``,
    ``all_devices``, ...) is Tunix's tracer's.
    """

    def __init__(self, theirs: Any, ours: OTelPerfTracer) -> None:
        self.theirs = theirs
        self.ours = ours

    def __getattr__(self, name: str) -> Any:
        return getattr(self.theirs, name)

    @contextlib.contextmanager
    def span_group(self, name: str) -> Iterator[None]:
        """Tunix's span group, and otel-tunix's step or component."""
        with self.theirs.span_group(name), self.ours.span_group(name):
            yield

    @contextlib.contextmanager
    def span(
        self, name: str, devices: Any = None, tags: Mapping[str, Any] | None = None
    ) -> Iterator[_TeeWaitlist]:
        """Tunix's span (v1 takes no tags), and otel-tunix's component."""
        theirs = (
            self.theirs.span(name, devices)
            if tags is None
            else self.theirs.span(name, devices, tags=tags)
        )
        with theirs as t, self.ours.span(name, devices, tags) as o:
            yield _TeeWaitlist(t, o)


class _TeeWaitlist:
    """The waitlists of both tracers: arrays that end the span are given to each."""

    __slots__ = ("_ours", "_theirs")

    def __init__(self, theirs: Any, ours: _Waitlist) -> None:
        self._theirs = theirs
        self._ours = ours

    def device_end(self, waitlist: Any) -> None:
        self._theirs.device_end(waitlist)
        self._ours.device_end(waitlist)

    def async_end(self, waitlist: Any) -> None:
        self._theirs.async_end(waitlist)
        self._ours.async_end(waitlist)

    @property
    def waitlist(self) -> Any:
        return self._theirs.waitlist


def _close_span(
    comp: Any, step_cm: Any, token: Any, waitlist: _Waitlist, exc: BaseException | None
) -> None:
    try:
        if token is not None:
            _innermost.reset(token)
        if comp is not None:
            if waitlist.arrays and comp.recording:
                comp.end_on_device(device_end(list(waitlist.arrays)))
            comp.__exit__(type(exc) if exc else None, exc, None)
        if step_cm is not None:
            step_cm.__exit__(type(exc) if exc else None, exc, None)
    except ValueError:  # reset() in another context (thread or task) than the span was opened in
        warn_once(
            ("tunix", "span-context"),
            "otel-tunix: closing a Tunix span failed: it was left in another context than it "
            "was entered in",
            logger=_logger,
            level=logging.DEBUG,
            exc_info=True,
        )
    except Exception:  # the step and component close themselves without raising
        report_internal_error("closing a Tunix span")
