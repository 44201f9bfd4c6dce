"""A run's parts: closed in order before one deadline, side-by-side ones together."""

from __future__ import annotations

import threading
import time

import otel_tunix
from otel_tunix.run import setup
from otel_tunix.run.parts import Part, close_parts
from otel_tunix.run.run_parts import ProviderPart, SignalPart, StepsPart


class _Recorder(Part):
    def __init__(self, name: str, log: list[str], *, side_by_side: bool = False, hold=None):
        self.name = name
        self.side_by_side = side_by_side
        self._log = log
        self._hold = hold

    def close(self, deadline: float) -> bool:
        self._log.append(f"start {self.name}")
        if self._hold is not None:
            self._hold.wait()
        self._log.append(f"end {self.name}")
        return True


def test_parts_close_in_order_and_those_side_by_side_are_left_at_the_deadline():
    log: list[str] = []
    never = threading.Event()
    parts = [
        _Recorder("files", log),
        _Recorder("exporter", log, side_by_side=True, hold=never),
        _Recorder("provider", log, side_by_side=True),
        _Recorder("detach", log),
    ]
    started = time.monotonic()
    unfinished = close_parts(parts, started + 0.3)
    took = time.monotonic() - started
    never.set()
    assert unfinished == ["exporter"]
    assert 0.3 <= took < 2.0
    assert log[0] == "start files" and log[1] == "end files"
    assert set(log[2:5]) == {"start exporter", "start provider", "end provider"}
    assert log[5:] == ["start detach", "end detach"]  # after the side-by-side ones


def test_a_side_by_side_part_that_gave_up_at_the_deadline_is_unfinished():
    """A part that stops at the deadline by itself (close() answers False: the Perfetto
    translation) ends before the wait for it does; it is named all the same. One that
    raised is reported as failed, not as unfinished."""

    class GaveUp(Part):
        name, side_by_side = "gave up", True

        def close(self, deadline: float) -> bool:
            return False

    class Done(Part):
        name, side_by_side = "done", True

    class Raised(Part):
        name, side_by_side = "raised", True

        def close(self, deadline: float) -> bool:
            raise RuntimeError("its own failure")

    deadline = time.monotonic() + 5
    assert close_parts([GaveUp(), Done(), Raised()], deadline) == ["gave up"]
    assert time.monotonic() < deadline  # nobody waited for the deadline


def test_configure_lists_the_parts_that_shutdown_walks(tmp_path):
    otel_tunix.configure(output_dir=tmp_path, system_metrics=False)
    state = setup._state
    assert state is not None
    kinds = [type(p) for p in state.parts]
    assert kinds[0] is SignalPart  # given back first
    assert kinds.index(StepsPart) < kinds.index(ProviderPart)  # local files before exporters
    otel_tunix.shutdown()
    assert setup._state is None
