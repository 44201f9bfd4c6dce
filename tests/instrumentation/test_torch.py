"""otel_tunix.instrumentation.torch on real PyTorch runs (CPU here; CUDA tests skip without a
GPU and were run on an H100, see docs/torch.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import otel_tunix  # noqa: E402
from otel_tunix.instrumentation import _torch_device  # noqa: E402
from otel_tunix.instrumentation import torch as ott  # noqa: E402
from otel_tunix.settings import attributes as attr  # noqa: E402
from otel_tunix.testing import capture  # noqa: E402

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _batches(n: int) -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


@pytest.fixture
def instrumented() -> Iterator[tuple[Any, Any]]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ott.instrument_model(model)
    ott.instrument_optimizer(opt)
    yield model, opt
    ott.uninstrument_model(model)
    ott.uninstrument_optimizer(opt)


def _by_id(spans: list[Any]) -> dict[int, Any]:
    return {s.context.span_id: s for s in spans}


def _parent_name(span: Any, by_id: dict[int, Any]) -> str | None:
    parent = by_id.get(span.parent.span_id) if span.parent else None
    return parent.name if parent is not None else None


def test_loop_spans_parentage_and_counters(instrumented: tuple[Any, Any]) -> None:
    model, opt = instrumented
    with capture() as cap:
        loader = ott.instrument_dataloader(_batches(3))
        it = iter(loader)
        for n in range(3):
            with otel_tunix.step(n):
                x, y = next(it)
                with otel_tunix.component("train_step_compute"):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
        spans = cap.spans()
    by_id = _by_id(spans)
    steps = [s for s in spans if s.name == "train_step"]
    assert [s.attributes[attr.STEP] for s in steps] == [0, 1, 2]
    names = [s.name for s in spans if s.attributes[attr.STEP] == 1]
    assert names == [
        "train_data_load",
        "train_step_compute",
        "forward",
        "backward",
        "optimizer_step",
        "train_step",
    ]
    for s in spans:
        if s.name in ("forward", "backward", "optimizer_step"):
            assert _parent_name(s, by_id) == "train_step_compute"
            assert s.end_time > s.start_time
            assert attr.DEVICE_END not in s.attributes  # no CUDA: host time
        elif s.name in ("train_data_load", "train_step_compute"):
            assert _parent_name(s, by_id) == "train_step"
    summary = cap.summaries[1]
    assert set(summary.components) == set(names[:-1])
    assert summary.components["forward"].count == 1
    assert summary.components["forward"].busy_time_sec > 0
    # nested components: the step's busy time is the union, not the sum
    assert summary.busy_time_sec <= summary.step_time_sec


def test_dataloader_wait_is_a_component_and_delegates() -> None:
    ds = torch.utils.data.TensorDataset(torch.randn(12, 3), torch.randn(12, 1))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    wrapped = ott.instrument_dataloader(loader)
    assert len(wrapped) == 3 and wrapped.dataset is ds and wrapped.blocked is False
    with capture() as cap:
        it = iter(wrapped)
        for n in range(3):
            with otel_tunix.step(n):
                next(it)
        with otel_tunix.step(3):
            with pytest.raises(StopIteration):
                next(it)  # the end of the epoch is not a fetch
        spans = cap.spans()
    loads = [s for s in spans if s.name == "train_data_load"]
    assert [s.attributes[attr.STEP] for s in loads] == [0, 1, 2]
    assert all(s.attributes[attr.TIME_KIND] == attr.KIND_BUSY for s in loads)


class _TimedDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    """Items that take a few ms to make, each timed by the dataset's own clock."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.made_ns: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        t = time.perf_counter_ns()
        time.sleep(0.004)
        self.made_ns.append(time.perf_counter_ns() - t)
        return torch.full((2,), float(i))


def test_the_usual_loop_gives_each_fetch_to_its_step(tmp_path: Any) -> None:
    import json

    from otel_tunix.analysis.breakdown import summarize
    from otel_tunix.analysis.ledger import job_ledger

    ds = _TimedDataset(6)
    loader = ott.instrument_dataloader(torch.utils.data.DataLoader(ds, batch_size=2))
    out = tmp_path / "run"
    otel_tunix.configure(output_dir=out)
    gaps = []  # the user's clock: from the end of a body to the start of the next
    before = time.perf_counter_ns()
    for n, _batch in enumerate(loader):  # the step opened inside the body
        gaps.append(time.perf_counter_ns() - before)
        with otel_tunix.step(n), otel_tunix.component("train_step_compute"):
            time.sleep(0.002)
        before = time.perf_counter_ns()
    otel_tunix.shutdown()

    lines = [json.loads(x) for x in (out / "spans.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["type"] == "step"]
    assert [x["step"] for x in steps] == [0, 1, 2]
    made = [sum(ds.made_ns[2 * n : 2 * n + 2]) / 1e9 for n in range(3)]
    for x, gap, own in zip(steps, gaps, made, strict=True):
        load = x["components"]["train_data_load"]["busy_time_sec"]
        # the fetch, inside the gap the user measured, holding the items the dataset made
        assert own <= load <= gap / 1e9
        compute = x["components"]["train_step_compute"]["busy_time_sec"]
        assert x["step_time_sec"] >= load + compute  # the step starts at its fetch
    loaded = sum(x["components"]["train_data_load"]["busy_time_sec"] for x in steps)
    # in the summary, as a component of the step
    (scope,) = summarize(out).scopes
    assert "train_data_load" in [c.name for c in scope.components]
    # and in the goodput ledger, as data stall
    stall = job_ledger(out).goodput.badput_sec.get("data_stall", 0.0)
    assert stall == pytest.approx(loaded, rel=1e-6, abs=1e-6)


def test_a_step_given_its_start_or_opened_in_a_step_takes_no_fetch() -> None:
    batches = _batches(4)
    with capture() as cap:
        it = iter(ott.instrument_dataloader(batches))
        next(it)  # no step open: handed to the next step opened here
        with otel_tunix.step(0, start_ns=time.perf_counter_ns()):  # its own start: not taken
            pass
        with otel_tunix.step(1):  # the hand-over was spent on step 0
            pass
        next(it)
        with otel_tunix.step(2), otel_tunix.component("work"):
            pass
        with otel_tunix.step(3):
            next(it)  # the classic loop: fetched inside the step
        spans = cap.spans()
    loads = sorted(s.attributes[attr.STEP] for s in spans if s.name == "train_data_load")
    assert loads == [2, 3]


@pytest.mark.slow
def test_prefetching_loader_wait_is_blocked() -> None:
    ds = torch.utils.data.TensorDataset(torch.randn(8, 3))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=1)
    wrapped = ott.instrument_dataloader(loader)
    assert wrapped.blocked is True
    with capture() as cap:
        it = iter(wrapped)
        for n in range(2):
            with otel_tunix.step(n):
                next(it)
        spans = cap.spans()
    loads = [s for s in spans if s.name == "train_data_load"]
    assert [s.attributes[attr.TIME_KIND] for s in loads] == [attr.KIND_BLOCKED] * 2
    assert cap.summaries[0].blocked_time_sec > 0
    assert cap.summaries[0].components["train_data_load"].blocked_time_sec > 0


def test_exception_in_forward_leaves_no_open_span(instrumented: tuple[Any, Any]) -> None:
    model, _ = instrumented

    class Boom(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("bad batch")

    boom = Boom()
    ott.instrument_model(boom, forward="boom_forward")
    try:
        with capture() as cap:
            with otel_tunix.step(0):
                with pytest.raises(ValueError, match="bad batch"):
                    boom(torch.zeros(1))
                model(torch.zeros(2, 8)).sum().backward()
            spans = cap.spans()
    finally:
        ott.uninstrument_model(boom)
    by_id = _by_id(spans)
    assert [s.name for s in spans] == ["boom_forward", "forward", "backward", "train_step"]
    assert all(_parent_name(s, by_id) == "train_step" for s in spans[:3])
    assert not any(s.attributes.get(attr.INCOMPLETE) for s in spans)


def test_nested_and_recursive_calls_are_one_forward(instrumented: tuple[Any, Any]) -> None:
    model, _ = instrumented
    outer = torch.nn.Sequential(model)  # the instrumented model runs inside another module
    with capture() as cap:
        with otel_tunix.step(0):
            outer(torch.zeros(2, 8))
            with ott.quiet_forward():
                model(torch.zeros(2, 8))  # e.g. generation: not recorded call by call
        spans = cap.spans()
    assert [s.name for s in spans] == ["forward", "train_step"]


def test_uninstrument_restores_torch(instrumented: tuple[Any, Any]) -> None:
    model, _ = instrumented
    assert hasattr(torch.autograd.backward, "__otel_tunix_original__")
    ott.uninstrument_model(model)
    assert not hasattr(torch.autograd.backward, "__otel_tunix_original__")
    with capture() as cap:
        with otel_tunix.step(0):
            model(torch.zeros(2, 8)).sum().backward()
        spans = cap.spans()
    assert [s.name for s in spans] == ["train_step"]


@pytest.mark.slow
def test_torch_compiled_model(instrumented: tuple[Any, Any]) -> None:
    model, opt = instrumented
    compiled = torch.compile(model, backend="aot_eager")
    ott.instrument_model(compiled, forward="compiled_forward")
    x = torch.randn(4, 8)
    try:
        with capture() as cap:
            for n in range(2):
                with otel_tunix.step(n):
                    loss = compiled(x).square().mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
            spans = cap.spans()
    finally:
        ott.uninstrument_model(compiled)
    names = [s.name for s in spans if s.attributes[attr.STEP] == 1]
    # the hooks on the compiled wrapper and on the module compiled inside it both run
    assert names == ["compiled_forward", "forward", "backward", "optimizer_step", "train_step"]
    by_id = _by_id(spans)
    inner = [s for s in spans if s.name == "forward"]
    assert all(_parent_name(s, by_id) == "compiled_forward" for s in inner)
    assert torch.allclose(compiled(x), model(x))


def test_device_component_without_cuda_is_a_component() -> None:
    with capture() as cap:
        with otel_tunix.step(0):
            with ott.device_component("train_step_compute") as c:
                assert c.recording
                torch.ones(3).sum()

            @ott.device_component("decorated", blocked=True)
            def wait() -> int:
                return 7

            assert wait() == 7
        spans = cap.spans()
    assert [s.name for s in spans] == ["train_step_compute", "decorated", "train_step"]
    assert spans[1].attributes[attr.TIME_KIND] == attr.KIND_BLOCKED
    if not torch.cuda.is_initialized():
        assert attr.DEVICE_END not in spans[0].attributes


def test_memory_stats_are_empty_without_cuda() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is in use in this process")
    assert ott.memory_stats() == {}
    with capture():
        assert ott.record_memory_stats(step=0) == {}
        assert not any(k.startswith("memory/") for k in otel_tunix.get_metrics_logger().last_values)


def test_rank_from_torch_distributed(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not built in")
    assert ott.distributed_rank_attributes() == {}
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        assert ott.distributed_rank_attributes() == {attr.RANK: 0, attr.WORLD_SIZE: 1}
        monkeypatch.setenv("LOCAL_RANK", "0")
        assert ott.distributed_rank_attributes()[attr.LOCAL_RANK] == 0
    finally:
        dist.destroy_process_group()


def test_instrumentor_auto_steps_for_a_plain_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.instrumentation")
    from otel_tunix.instrumentation import _base

    monkeypatch.setattr(_base, "_auto_configure", False)  # instrument() turns it on
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ds = torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 1))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    instrumentor = ott.TorchInstrumentor()
    with capture() as cap:
        instrumentor.instrument()
        try:
            for _ in range(2):  # two epochs of four steps, no otel_tunix.step in the loop
                for x, y in loader:
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            with otel_tunix.step(100):  # the program's own step: left alone
                for x, _y in loader:
                    model(x).sum().backward()
                    opt.step()
                    break
        finally:
            instrumentor.uninstrument()
        spans = cap.spans()
    steps = [s for s in spans if s.name == "train_step"]
    assert [s.attributes[attr.STEP] for s in steps] == [*range(8), 100]
    for n in range(8):  # the step opens at the fetch; the model's call is its forward
        assert [s.name for s in spans if s.attributes[attr.STEP] == n] == [
            "train_data_load",
            "forward",
            "backward",
            "optimizer_step",
            "train_step",
        ]
    assert [s.name for s in spans if s.attributes[attr.STEP] == 100] == ["backward", "train_step"]
    assert torch.utils.data.DataLoader.__iter__.__name__ == "__iter__"
    assert not hasattr(torch.autograd.backward, "__otel_tunix_original__")


def _module_hooks() -> int:
    from torch.nn.modules import module

    return len(module._global_forward_pre_hooks) + len(module._global_forward_hooks)


def test_instrumentor_opens_the_step_at_the_models_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches from a plain iterator: the step opens at the model's (outermost) forward, so
    forward is inside it; after the first step only the root modules keep hooks."""
    pytest.importorskip("opentelemetry.instrumentation")
    from otel_tunix.instrumentation import _base

    monkeypatch.setattr(_base, "_auto_configure", False)
    model = _model()
    loss_fn = torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    before = _module_hooks()
    instrumentor = ott.TorchInstrumentor()
    calls: list[tuple[int, int]] = []  # the model's own forward, on the test's clock
    forward = model.forward

    def timed_forward(x: Any) -> Any:
        t0 = time.time_ns()
        out = forward(x)
        calls.append((t0, time.time_ns()))
        return out

    model.forward = timed_forward
    with capture() as cap:
        instrumentor.instrument()
        try:
            with torch.no_grad():
                model(torch.zeros(1, 8))  # inference outside any step: opens none
            hooks_in_first_step = _module_hooks()
            for x, y in iter(_batches(4)):
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            hooks_after = _module_hooks()
        finally:
            instrumentor.uninstrument()
        spans = cap.spans()
    assert hooks_in_first_step == before + 2 and hooks_after == before  # narrowed to roots
    assert _module_hooks() == before and not model._forward_pre_hooks  # all removed
    steps = [s for s in spans if s.name == "train_step"]
    numbers = [s.attributes[attr.STEP] for s in steps]
    assert numbers == list(range(numbers[0], numbers[0] + 4))  # (counted on from other tests)
    for i, (n, step) in enumerate(zip(numbers, steps, strict=True)):
        names = [s.name for s in spans if s.attributes[attr.STEP] == n]
        # the model and the loss module are both root calls: two forward spans
        assert names == ["forward", "forward", "backward", "optimizer_step", "train_step"]
        fwd = next(s for s in spans if s.attributes[attr.STEP] == n and s.name == "forward")
        start, end = calls[i + 1]  # after the no_grad call
        assert step.start_time <= fwd.start_time <= start and end <= fwd.end_time


def test_zero_grad_starts_the_automatic_step_unless_the_program_opens_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``zero_grad()`` first, as most loops do: the automatic step starts there (the next
    activity opens it, backdated); before a step of the program's own it opens nothing."""
    pytest.importorskip("opentelemetry.instrumentation")
    from otel_tunix.instrumentation import _base

    monkeypatch.setattr(_base, "_auto_configure", False)
    model = _model()
    instrumentor = ott.TorchInstrumentor()
    zeroed: list[tuple[int, int]] = []  # before and after each zero_grad(), test's clock
    with capture() as cap:
        instrumentor.instrument()
        try:
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            for x, y in iter(_batches(3)):
                t0 = time.time_ns()
                opt.zero_grad()
                zeroed.append((t0, time.time_ns()))
                time.sleep(0.002)  # the iteration's own work before the forward
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            for n, (x, _y) in enumerate(_batches(2)):
                opt.zero_grad()  # outside the program's own step: starts nothing
                with otel_tunix.step(100 + n):
                    model(x).sum().backward()
                    opt.step()
        finally:
            instrumentor.uninstrument()
        spans = cap.spans()
    steps = [s for s in spans if s.name == "train_step"]
    assert [s.attributes[attr.STEP] for s in steps][-2:] == [100, 101]
    auto = steps[:-2]
    assert len(auto) == 3
    # Span times are perf_counter plus an epoch offset taken once, the test's are time_ns:
    # the two clocks may differ by tens of microseconds, far less than the 2 ms between
    # zero_grad() and the forward that the check tells apart.
    slack = 500_000
    for step, (t0, t1) in zip(auto, zeroed, strict=True):
        assert t0 - slack <= step.start_time <= t1 + slack  # from zero_grad(), not forward


def test_instrumentor_with_compiled_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile(model)``: its wrapper is the root, one forward per step. A model
    compiled in place is not seen by the module hooks; with ``instrument_model`` its forward
    is one span per step and opens the step."""
    pytest.importorskip("opentelemetry.instrumentation")
    from otel_tunix.instrumentation import _base

    monkeypatch.setattr(_base, "_auto_configure", False)
    wrapped, in_place = _model(), _model()
    instrumentor = ott.TorchInstrumentor()
    with capture() as cap:
        instrumentor.instrument()
        try:
            compiled = torch.compile(wrapped, backend="aot_eager")
            in_place.compile(backend="aot_eager")
            ott.instrument_model(in_place)
            for model in (compiled, in_place):
                opt = torch.optim.SGD(model.parameters(), lr=1e-3)
                for x, _y in iter(_batches(3)):
                    opt.zero_grad()
                    model(x).sum().backward()
                    opt.step()
        finally:
            ott.uninstrument_model(in_place)
            instrumentor.uninstrument()
        spans = cap.spans()
    steps = [s for s in spans if s.name == "train_step"]
    assert len(steps) == 6
    for step in steps:
        n = step.attributes[attr.STEP]
        names = [s.name for s in spans if s.attributes[attr.STEP] == n]
        # dynamo's own compilations (instrument_compile; tested in test_compilations.py) may sit
        # in a step, depending on what dynamo has cached from earlier tests
        assert [m for m in names if m != "torch_compile"] == [
            "forward",
            "backward",
            "optimizer_step",
            "train_step",
        ]


def test_backward_in_another_thread_records_into_the_open_step(
    instrumented: tuple[Any, Any],
) -> None:
    model, _ = instrumented
    with capture() as cap:
        with otel_tunix.step(0):
            t = threading.Thread(target=lambda: model(torch.zeros(1, 8)).sum().backward())
            t.start()
            t.join()
        spans = cap.spans()
    assert [s.name for s in spans] == ["forward", "backward", "train_step"]


# --- CUDA (skipped without a GPU) -----------------------------------------------------------
@requires_cuda
def test_cuda_span_ends_at_device_completion_without_synchronizing() -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    with capture() as cap:
        with otel_tunix.step(0):
            with ott.device_component("matmuls"):
                for _ in range(50):
                    a @ b
        # the host left the block long before the GPU finished: nothing synchronised
        assert not torch.cuda.current_stream().query()
        spans = cap.spans()
    span = spans[0]
    assert span.attributes[attr.DEVICE_END] is True
    host = span.attributes[attr.HOST_DURATION]
    total = (span.end_time - span.start_time) * 1e-9
    assert total > 50 * 0.1e-3  # 50 matmuls of about 0.19 ms each on an H100
    assert host < total / 2
    if ott.DEVICE_DURATION in span.attributes:
        assert 50 * 0.1e-3 < span.attributes[ott.DEVICE_DURATION] <= total


@requires_cuda
def test_cuda_adjacent_components_share_events() -> None:
    x = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    clock = _torch_device._cuda_clock()
    assert clock is not None
    with capture() as cap:
        with otel_tunix.step(0):
            with ott.device_component("outer"):  # starts with "a": one shared event
                recorded = clock.events_recorded
                with ott.device_component("a"):
                    x @ x
                with ott.device_component("b"):  # starts where "a" ended
                    x @ x
                with ott.device_component("c"):
                    x @ x
            n_events = clock.events_recorded - recorded
        spans = cap.spans()
    # Unshared, a, b, c and outer record 7 events; shared, only the ends of a, b and c (c's
    # is also outer's end). A thread switch between two boundaries can cost one more.
    print(f"events: {n_events}, sharing window {clock.window_ns} ns")
    assert 3 <= n_events <= 5, n_events
    assert all(s.attributes.get(attr.DEVICE_END) for s in spans if s.name != "train_step")
    by_name = {s.name: s for s in spans}
    assert by_name["a"].end_time <= by_name["b"].end_time <= by_name["c"].end_time
    assert by_name["outer"].end_time >= by_name["c"].end_time


@requires_cuda
def test_cuda_model_hooks_and_memory_stats(instrumented: tuple[Any, Any]) -> None:
    model = _model().cuda()
    opt = torch.optim.AdamW(model.parameters())
    ott.instrument_model(model)
    ott.instrument_optimizer(opt)
    try:
        with capture() as cap:
            for n in range(2):
                with otel_tunix.step(n):
                    model(torch.randn(64, 8, device="cuda")).sum().backward()
                    opt.step()
            spans = cap.spans()
            logged = dict(otel_tunix.get_metrics_logger().last_values)
            metrics = cap.metrics()
    finally:
        ott.uninstrument_model(model)
        ott.uninstrument_optimizer(opt)
    for s in spans:
        if s.name in ("forward", "backward", "optimizer_step"):
            assert s.attributes[attr.DEVICE_END] is True
    assert logged["memory/allocated_bytes"] > 0
    assert logged["memory/peak_allocated_bytes"] >= logged["memory/allocated_bytes"]
    assert logged["memory/reserved_bytes"] >= logged["memory/allocated_bytes"]
    assert metrics["tunix.memory.allocated"][0].value > 0
    assert dict(metrics["tunix.memory.allocated"][0].attributes)["device"].startswith("cuda:")


@requires_cuda
@pytest.mark.slow
def test_cuda_inductor_compiled_model() -> None:
    model = _model().cuda()
    compiled = torch.compile(model)
    ott.instrument_model(compiled)
    try:
        with capture() as cap:
            for n in range(3):
                with otel_tunix.step(n):
                    compiled(torch.randn(64, 8, device="cuda")).sum().backward()
            spans = cap.spans()
    finally:
        ott.uninstrument_model(compiled)
    assert [s.name for s in spans if s.attributes[attr.STEP] == 2] == [
        "forward",
        "backward",
        "train_step",
    ]
    assert all(s.attributes.get(attr.DEVICE_END) for s in spans if s.name == "forward")


# --- the event clock against a simulated device (runs everywhere) ---------------------------
class _FakeDevice:
    """A GPU stand-in: work runs in order, in host time, starting no earlier than its launch."""

    def __init__(self) -> None:
        self.busy_until = 0

    def launch(self, ns: int) -> None:
        now = time.perf_counter_ns()
        self.busy_until = max(now, self.busy_until) + ns
        while time.perf_counter_ns() - now < 500_000:  # a launch costs host time too
            pass


class _FakeEvent:
    device: _FakeDevice

    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.done_at = 0

    def query(self) -> bool:
        return time.perf_counter_ns() >= self.done_at

    def synchronize(self) -> None:
        while not self.query():
            time.sleep(50e-6)

    def elapsed_time(self, other: _FakeEvent) -> float:
        return (other.done_at - self.done_at) / 1e6


class _FakeTorch:
    """Just the calls _CudaClock makes."""

    def __init__(self) -> None:
        dev = self.device = _FakeDevice()
        ns = SimpleNamespace

        self.reached: list[int] = []  # when the device reached each event, in record order

        def record(event: _FakeEvent, stream: Any) -> None:
            event.done_at = max(time.perf_counter_ns(), dev.busy_until)
            self.reached.append(event.done_at)

        self._C = ns(
            _cuda_isCurrentStreamCapturing=lambda: False,
            _cuda_getCurrentStream=lambda device: (3, device, 1),
            _CudaEventBase=ns(record=record),
        )
        self.cuda = ns(Event=_FakeEvent, Stream=lambda **kw: ns(**kw))
        self.zeros = lambda *a, **kw: ns(add_=lambda v: dev.launch(1000))


@pytest.mark.parametrize("backlog_ms", [30, 0])
def test_event_clock_on_a_simulated_device(
    monkeypatch: pytest.MonkeyPatch, backlog_ms: int
) -> None:
    fake = _FakeTorch()
    clock = _torch_device._CudaClock(fake, 0)
    assert 0 < clock.window_ns <= ott.SHARE_WINDOW_NS
    clock.window_ns = 250_000  # shorter than a launch (0.5 ms here), longer than our loop
    monkeypatch.setattr(_torch_device, "_cuda_clock", lambda: clock)
    true_end: dict[str, int] = {}
    around: dict[str, tuple[int, int]] = {}
    with capture(clock=time.perf_counter_ns) as cap:  # span times in perf_counter ns
        with otel_tunix.step(0):
            fake.device.busy_until = time.perf_counter_ns() + backlog_ms * 1_000_000
            with ott.device_component("outer"):
                for name, ms in (("a", 5), ("b", 10), ("c", 5)):
                    t0 = time.perf_counter_ns()
                    with ott.device_component(name):
                        fake.device.launch(ms * 1_000_000)
                        true_end[name] = fake.device.busy_until
                    around[name] = (t0, time.perf_counter_ns())
        spans = {s.name: s for s in cap.spans()}
        resolved_by = time.perf_counter_ns()  # every device end was resolved before this
    # spans end when the simulated device finished, not when the host left the block
    assert all(spans[n].attributes[attr.DEVICE_END] for n in ("outer", "a", "b", "c"))
    # The truth of each end is when the device reached the boundary event after the work:
    # its work's end, or the event's recording if the host got there later (a loaded host
    # can be descheduled for longer than a launch's 5 ms; a real GPU behaves the same).
    # Boundaries in record order: outer/a start, a/b, b/c, c/outer end.
    assert len(fake.reached) == 4
    for name, reached in zip(("a", "b", "c"), fake.reached[1:], strict=True):
        assert reached >= true_end[name]
        # Never before the device got there (the clock's lower bound, off by at most its
        # ANCHOR_SLACK_NS): ending at the host's exit instead would be >= 4.5 ms early with
        # no backlog, >= 30 ms with one. Late only by how late the device-waiter thread
        # woke, which on a loaded host is unbounded: bracketed by the test's own reading.
        error_ms = (spans[name].end_time - reached) / 1e6
        assert error_ms > -2.0, (name, error_ms)
        assert spans[name].end_time <= resolved_by, (name, error_ms)
        # the host only launched the work: its duration lies within the test's own clock
        # readings around the block, not the device's (bracketed, so load cannot break it)
        host_ns = spans[name].attributes[attr.HOST_DURATION] * 1e9
        assert host_ns <= around[name][1] - around[name][0] + 1000, (name, host_ns, around)
        assert spans[name].start_time >= around[name][0]
    assert spans["outer"].end_time == spans["c"].end_time  # one shared boundary
    # The step's window is the host's: the device work runs past it (device figures apart).
    assert spans["train_step"].end_time <= spans["c"].end_time
    assert clock.events_recorded == 4  # outer/a start, a/b, b/c, c/outer end: N + 1
    assert 0 <= clock.waits <= 3  # a wait is on the newest boundary: it can place several
    # every event went back to the pool except the anchor and the thread's last boundary
    assert clock.events_created - len(clock._pool) <= 3


def test_optimizer_step_covers_the_whole_step_call_and_comes_off_cleanly() -> None:
    """The span is the whole ``optimizer.step()`` call, PyTorch's own wrapper (profiler
    scope, step hooks) included: it lies within a clock pair around each call and encloses
    the step hooks PyTorch runs inside it; a learning-rate scheduler's wrapper of ``step``
    survives instrumenting and uninstrumenting."""
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    scheduler_step = opt.__dict__.get("step")  # the scheduler's wrapper, if this torch has one
    ott.instrument_optimizer(opt, memory_stats=False)  # nothing but the span around step
    pre: list[int] = []
    post: list[int] = []
    hooks = [  # PyTorch's own hooks, run inside its step wrapper
        opt.register_step_pre_hook(lambda *_: pre.append(time.perf_counter_ns())),
        opt.register_step_post_hook(lambda *_: post.append(time.perf_counter_ns())),
    ]
    around: list[tuple[int, int]] = []
    try:
        # span times read from perf_counter_ns as they are: comparable with the test's clock
        with capture(clock=time.perf_counter_ns) as cap:
            for n in range(6):
                with otel_tunix.step(n):
                    model(torch.randn(16, 64)).sum().backward()
                    t0 = time.perf_counter_ns()
                    opt.step()
                    t1 = time.perf_counter_ns()
                    around.append((t0, t1))
                sched.step()
            spans = [s for s in cap.spans() if s.name == "optimizer_step"]
    finally:
        ott.uninstrument_optimizer(opt)
        for hook in hooks:
            hook.remove()
    assert len(spans) == len(pre) == len(post) == 6
    for s, (t0, t1), p0, p1 in zip(spans, around, pre, post, strict=True):
        assert s.start_time is not None and s.end_time is not None
        assert t0 <= s.start_time <= p0  # begins before PyTorch's step machinery
        assert p1 <= s.end_time <= t1  # and ends after it, within the call
    assert opt.__dict__.get("step") is scheduler_step  # put back as it was
    assert sched.last_epoch == 6  # the scheduler still counts steps


def test_zero_code_optimizer_step_covers_the_whole_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the instrumentor, an optimizer made after ``instrument()`` has its ``step``
    wrapped as it is made: the automatic step's ``optimizer_step`` encloses PyTorch's own
    step hooks; uninstrumenting restores the instance and ``Optimizer.__init__``."""
    pytest.importorskip("opentelemetry.instrumentation")
    from otel_tunix.instrumentation import _base

    monkeypatch.setattr(_base, "_auto_configure", False)
    model = _model()
    original_init = torch.optim.Optimizer.__init__
    instrumentor = ott.TorchInstrumentor()
    pre: list[int] = []
    post: list[int] = []
    with capture(clock=time.perf_counter_ns) as cap:
        instrumentor.instrument()
        try:
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)  # made after instrument()
            opt.register_step_pre_hook(lambda *_: pre.append(time.perf_counter_ns()))
            opt.register_step_post_hook(lambda *_: post.append(time.perf_counter_ns()))
            for _ in range(3):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
        finally:
            instrumentor.uninstrument()
        spans = [s for s in cap.spans() if s.name == "optimizer_step"]
    assert len(spans) == len(pre) == len(post) == 3  # one span a call, not two
    for s, p0, p1 in zip(spans, pre, post, strict=True):
        assert s.start_time is not None and s.end_time is not None
        assert s.start_time <= p0 and p1 <= s.end_time
    numbers = [s.attributes[attr.STEP] for s in spans]
    assert numbers == list(range(numbers[0], numbers[0] + 3))  # each ended a step
    assert "step" not in opt.__dict__
    assert torch.optim.Optimizer.__init__ is original_init
