"""Generation metrics from real token timestamps: a Python generator, and a real (tiny,
randomly initialised) Hugging Face model, whose prefill and decode steps take a known time.

The time is the generation module's clock, stepped by the test (:class:`SteppedClock`): a
prefill takes exactly ``PREFILL_SEC`` and a decode step ``DECODE_SEC``, so the measured
durations are asserted exactly. With real sleeps they could only be bounded, and a loaded
2-core CI machine overran any upper bound tight enough to tell a prefill from a decode step.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_tunix.metrics import generation
from otel_tunix.metrics.generation import GenerationMetrics
from otel_tunix.model.metric_spec import TIME_TO_FIRST_TOKEN_BUCKETS

PREFILL_SEC = 0.12
DECODE_SEC = 0.03


class SteppedClock:
    """Stands in for ``time.perf_counter`` in the generation module: it moves only when the
    test advances it, by exactly that much (a fake clock: the only stand-in in this file)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, sec: float) -> None:
        self.now += sec


@pytest.fixture
def clock(monkeypatch):
    c = SteppedClock()
    monkeypatch.setattr(generation, "_clock", c)
    return c


def _exactly(value: float) -> object:
    return pytest.approx(value, rel=0, abs=1e-9)  # sums of stepped floats, rounded


@pytest.fixture
def reader_and_metrics():
    reader = InMemoryMetricReader()
    gm = GenerationMetrics(MeterProvider(metric_readers=[reader]), model_name="tiny")
    return reader, gm


def _points(reader):
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def _tokens(n: int, clock: SteppedClock):
    clock.advance(PREFILL_SEC)
    for i in range(n):
        if i:
            clock.advance(DECODE_SEC)
        yield i


def test_stream_of_a_python_generator_measures_ttft_tpot_and_e2e(reader_and_metrics, clock):
    reader, gm = reader_and_metrics
    assert list(gm.stream(_tokens(5, clock), prompt_tokens=7)) == [0, 1, 2, 3, 4]
    s = gm.stats()
    assert s.last_ttft_sec == _exactly(PREFILL_SEC)
    assert s.last_tpot_sec == _exactly(DECODE_SEC)
    assert s.last_e2e_sec == _exactly(PREFILL_SEC + 4 * DECODE_SEC)
    assert s.requests == {"stop": 1} and s.active == 0
    assert (s.prompt_tokens, s.output_tokens) == (7, 5)
    p = _points(reader)
    base = {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": "transformers",  # required by the GenAI conventions
        "gen_ai.request.model": "tiny",
    }
    ttft = p["gen_ai.server.time_to_first_token"][0]
    assert dict(ttft.attributes) == base and ttft.count == 1
    assert ttft.sum == pytest.approx(s.last_ttft_sec)
    assert list(ttft.explicit_bounds) == list(TIME_TO_FIRST_TOKEN_BUCKETS)
    assert p["gen_ai.server.time_per_output_token"][0].sum == pytest.approx(s.last_tpot_sec)
    assert p["tunix.generation.decode.duration"][0].sum == pytest.approx(4 * s.last_tpot_sec)
    assert p["tunix.generation.prefill.duration"][0].sum == pytest.approx(s.last_ttft_sec)
    usage = {dict(d.attributes)["gen_ai.token.type"]: d.sum for d in p["gen_ai.client.token.usage"]}
    assert usage == {"input": 7, "output": 5}
    req = p["tunix.generation.requests"][0]
    assert req.value == 1 and dict(req.attributes)["finish_reason"] == "stop"
    assert p["tunix.generation.requests.active"][0].value == 0
    assert p["tunix.generation.output_tokens"][0].value == 5
    assert p["tunix.generation.tokens_per_second"][0].value == pytest.approx(
        5 / (PREFILL_SEC + 4 * DECODE_SEC)
    )


def test_stream_records_errors_and_aborts(reader_and_metrics):
    _, gm = reader_and_metrics

    def broken():
        yield 1
        raise RuntimeError("engine died")

    with pytest.raises(RuntimeError):
        list(gm.stream(broken()))
    it = gm.stream(iter(range(10)))
    next(it)
    it.close()
    assert gm.stats().requests == {"error": 1, "abort": 1}
    assert gm.stats().active == 0


def test_manual_request_with_a_queue(reader_and_metrics):
    reader, gm = reader_and_metrics
    assert reader is not None
    r = gm.request(prompt_tokens=3, start=100.0)
    assert gm.stats().active == 1
    r.mark_scheduled(now=100.5)
    r.token(now=101.0)
    r.token(3, now=102.5)  # a chunk of three tokens
    r.finish("length", now=102.6)
    r.finish("stop")  # recorded once
    s = gm.stats()
    assert s.last_ttft_sec == 1.0 and s.last_tpot_sec == pytest.approx(1.5 / 3)
    assert s.last_e2e_sec == pytest.approx(2.6) and s.requests == {"length": 1}
    p = _points(reader)
    assert p["tunix.generation.prefill.duration"][0].sum == pytest.approx(0.5)  # queue excluded


def test_hugging_face_generate_with_real_first_token_timestamps(reader_and_metrics, clock):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    reader, gm = reader_and_metrics
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=64,
        eos_token_id=0, pad_token_id=0, bos_token_id=1,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()

    def slow_forward(module, args, kwargs):  # the prompt pass is the slow one, as on a GPU
        ids = kwargs.get("input_ids", args[0] if args else None)
        clock.advance(PREFILL_SEC if ids.shape[1] > 1 else DECODE_SEC)

    model.register_forward_pre_hook(slow_forward, with_kwargs=True)

    class Script(transformers.LogitsProcessor):
        """Row 0 emits EOS (0) as its 3rd token; row 1 never does."""

        def __call__(self, input_ids, scores):
            k = input_ids.shape[1] - 4
            out = torch.full_like(scores, -1e9)
            out[0, 0 if k >= 2 else 7] = 0
            out[1, 5] = 0
            return out

    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    out = gm.generate(
        model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
        do_sample=False, logits_processor=transformers.LogitsProcessorList([Script()]),
    )  # fmt: skip
    assert out[0, 4:].tolist() == [7, 7, 0, 0, 0, 0] and out[1, 4:].tolist() == [5] * 6
    s = gm.stats()
    assert s.requests == {"stop": 1, "length": 1} and s.active == 0
    assert (s.prompt_tokens, s.output_tokens) == (8, 3 + 6)
    p = _points(reader)
    ttft = p["gen_ai.server.time_to_first_token"][0]
    assert ttft.count == 2
    assert (ttft.min, ttft.max) == (_exactly(PREFILL_SEC), _exactly(PREFILL_SEC))
    tpot = p["gen_ai.server.time_per_output_token"][0]
    assert (tpot.min, tpot.max) == (_exactly(DECODE_SEC), _exactly(DECODE_SEC))
    e2e = p["gen_ai.server.request.duration"][0]
    # row 0 ends at its EOS (2 decode steps after the first token), row 1 runs 5
    assert e2e.min == _exactly(PREFILL_SEC + 2 * DECODE_SEC)
    assert e2e.max == _exactly(PREFILL_SEC + 5 * DECODE_SEC)
    reasons = {dict(d.attributes)["finish_reason"]: d.value for d in p["tunix.generation.requests"]}
    assert reasons == {"stop": 1, "length": 1}


def test_generate_keeps_the_callers_stopping_criteria_and_records_errors(reader_and_metrics):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _, gm = reader_and_metrics
    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=64,
                                  eos_token_id=0, pad_token_id=0)  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()

    class StopAfter(transformers.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 5, dtype=torch.bool)

    ids = torch.tensor([[1, 2, 3]])
    stop = transformers.StoppingCriteriaList([StopAfter()])
    out = gm.generate(
        model, input_ids=ids, max_new_tokens=10, do_sample=False, stopping_criteria=stop
    )
    assert out.shape[1] == 5
    assert gm.stats().output_tokens == 2
    with pytest.raises(Exception):  # noqa: B017 - whatever generate raises propagates
        gm.generate(model, input_ids=ids, max_new_tokens=2, not_an_option=object())
    assert gm.stats().requests["error"] == 1 and gm.stats().active == 0


def test_every_gen_ai_series_carries_the_conventions_required_attributes(clock):
    reader = InMemoryMetricReader()
    gm = GenerationMetrics(MeterProvider(metric_readers=[reader]), provider="vllm")
    list(gm.stream(_tokens(3, clock), prompt_tokens=2))
    gen_ai = {
        name: points for name, points in _points(reader).items() if name.startswith("gen_ai.")
    }
    assert len(gen_ai) == 4  # TTFT, TPOT, request duration, token usage
    for name, points in gen_ai.items():
        for point in points:
            attributes = dict(point.attributes)
            assert attributes["gen_ai.provider.name"] == "vllm", name
            assert attributes["gen_ai.operation.name"] == "text_completion", name
