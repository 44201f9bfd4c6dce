"""Generation metrics (rollouts and inference), measured from real token timestamps.

Per request: time to first token, time per output token, prefill and decode time,
end-to-end time, prompt and output tokens, finish reason; and the number of active requests
and output tokens per second. Names follow the GenAI semantic conventions where they exist
(``gen_ai.server.time_to_first_token``, ``gen_ai.server.time_per_output_token``,
``gen_ai.server.request.duration``, ``gen_ai.client.token.usage``), the rest is
``tunix.generation.*``; histogram boundaries are vLLM's (see the catalog).

Timestamps are taken when tokens exist, not estimated afterwards:

* :meth:`GenerationMetrics.generate` runs a Hugging Face ``model.generate`` with a stopping
  criterion that stamps the clock each time a token is appended (it is called after every
  decoding step, batched or not, with or without a streamer). The first stamp waits for the
  device once, so TTFT is the real prefill; later stamps are at most one decoding step early
  (``generate`` itself syncs every step). Sequences of a batch finish at their own EOS.
* :meth:`GenerationMetrics.stream` wraps any iterator of tokens or chunks (a server's
  stream, a Python generator): each item is stamped as it arrives.
* :meth:`GenerationMetrics.request` is the manual form for custom engines.

``transformers`` is imported only by :meth:`~GenerationMetrics.generate`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from opentelemetry.metrics import MeterProvider

from otel_tunix.logger.instruments import CatalogInstruments
from otel_tunix.support.errors import warn_once

__all__ = ["GenerationMetrics", "GenerationStats", "RequestTimer"]

_logger = logging.getLogger(__name__)
_T = TypeVar("_T")
_clock = time.perf_counter

TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
E2E = "gen_ai.server.request.duration"
TOKEN_USAGE = "gen_ai.client.token.usage"
PROVIDER_ATTRIBUTE = "gen_ai.provider.name"
"""Required by the GenAI conventions on every ``gen_ai.*`` metric: the generating engine."""
REQUESTS = "tunix.generation.requests"
ACTIVE = "tunix.generation.requests.active"
PROMPT_TOKENS = "tunix.generation.prompt_tokens"
OUTPUT_TOKENS = "tunix.generation.output_tokens"
PREFILL = "tunix.generation.prefill.duration"
DECODE = "tunix.generation.decode.duration"
TOKENS_PER_SECOND = "tunix.generation.tokens_per_second"


@dataclass(slots=True)
class GenerationStats:
    """In-process totals of a :class:`GenerationMetrics` (for summaries and notebooks)."""

    requests: Counter[str]
    active: int
    prompt_tokens: int
    output_tokens: int
    last_ttft_sec: float | None
    last_tpot_sec: float | None
    last_e2e_sec: float | None
    last_tokens_per_sec: float | None


class RequestTimer:
    """One request's clock. Call :meth:`token` as tokens arrive, then :meth:`finish`.

    As a context manager it finishes with ``stop`` (or ``error`` when the block raises)
    unless :meth:`finish` was called.
    """

    __slots__ = (
        "_done",
        "_owner",
        "first",
        "last",
        "prompt_tokens",
        "scheduled",
        "start",
        "tokens",
    )

    def __init__(self, owner: GenerationMetrics, prompt_tokens: int, start: float) -> None:
        self._owner = owner
        self.prompt_tokens = prompt_tokens
        self.start = start
        self.scheduled: float | None = None
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0
        self._done = False

    def mark_scheduled(self, now: float | None = None) -> None:
        """The request left the queue and its prefill starts (engines that queue)."""
        self.scheduled = _clock() if now is None else now

    def token(self, n: int = 1, now: float | None = None) -> None:
        """``n`` output tokens arrived now (or at ``now``, a ``time.perf_counter()``)."""
        t = _clock() if now is None else now
        if self.first is None:
            self.first = t
        self.last = t
        self.tokens += n

    def finish(
        self,
        finish_reason: str = "stop",
        *,
        output_tokens: int | None = None,
        now: float | None = None,
    ) -> None:
        """Record the request (once): ``finish_reason`` ``stop``, ``length``, ``error``...

        ``output_tokens`` overrides the count of :meth:`token` calls.
        """
        if self._done:
            return
        self._done = True
        end = _clock() if now is None else now
        n = self.tokens if output_tokens is None else output_tokens
        self._owner._record(self, finish_reason, n, end)

    def __enter__(self) -> RequestTimer:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.finish("error" if exc is not None else "stop")


class GenerationMetrics:
    """Records generation metrics on OTel instruments from the catalog.

    Args:
        meter_provider: Default: the current run's MeterProvider (the global one before
            ``configure()``).
        model_name: ``gen_ai.request.model`` attribute on every series (optional).
        operation: ``gen_ai.operation.name`` (default ``text_completion``).
        provider: ``gen_ai.provider.name``, the engine that generates (``vllm``,
            ``sglang``, ``tunix`` for Tunix's own rollout, ...): an attribute the GenAI
            conventions require on every series (default ``transformers``, the engine of
            :meth:`generate` and :meth:`stream`).
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        *,
        model_name: str | None = None,
        operation: str = "text_completion",
        provider: str = "transformers",
    ) -> None:
        self._inst = CatalogInstruments(meter_provider)
        self._attrs: dict[str, str] = {
            "gen_ai.operation.name": operation,
            PROVIDER_ATTRIBUTE: provider,
        }
        if model_name:
            self._attrs["gen_ai.request.model"] = model_name
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._active = 0
        self._prompt = 0
        self._output = 0
        self._last: dict[str, float | None] = {"ttft": None, "tpot": None, "e2e": None, "tps": None}

    # --- the manual form --------------------------------------------------------------
    def request(self, prompt_tokens: int = 0, *, start: float | None = None) -> RequestTimer:
        """Start a request now (or at ``start``, a ``time.perf_counter()`` reading)."""
        self._add_active(1)
        return RequestTimer(self, int(prompt_tokens), _clock() if start is None else start)

    def _add_active(self, n: int) -> None:
        with self._lock:
            self._active += n
        self._inst.record(ACTIVE, n, self._attrs)

    def _record(self, r: RequestTimer, reason: str, n_out: int, end: float) -> None:
        a = self._attrs
        rec = self._inst.record
        rec(ACTIVE, -1, a)
        rec(REQUESTS, 1, {**a, "finish_reason": reason})
        rec(PROMPT_TOKENS, r.prompt_tokens, a)
        rec(OUTPUT_TOKENS, n_out, a)
        rec(TOKEN_USAGE, r.prompt_tokens, {**a, "gen_ai.token.type": "input"})
        rec(TOKEN_USAGE, n_out, {**a, "gen_ai.token.type": "output"})
        e2e = max(end if r.last is None else max(end, r.last), r.start) - r.start
        rec(E2E, e2e, a)
        ttft = tpot = None
        if r.first is not None:
            ttft = r.first - r.start
            rec(TTFT, ttft, a)
            rec(PREFILL, r.first - (r.scheduled if r.scheduled is not None else r.start), a)
            if r.last is not None:
                decode = r.last - r.first
                rec(DECODE, decode, a)
                if n_out > 1:
                    tpot = decode / (n_out - 1)
                    rec(TPOT, tpot, a)
        with self._lock:
            self._active -= 1
            self._requests[reason] += 1
            self._prompt += r.prompt_tokens
            self._output += n_out
            self._last["ttft"], self._last["tpot"], self._last["e2e"] = ttft, tpot, e2e

    def _throughput(self, tokens: int, seconds: float) -> None:
        if seconds > 0:
            tps = tokens / seconds
            self._inst.record(TOKENS_PER_SECOND, tps, self._attrs)
            with self._lock:
                self._last["tps"] = tps

    # --- iterators ----------------------------------------------------------------------
    def stream(
        self,
        items: Iterable[_T],
        *,
        prompt_tokens: int = 0,
        tokens_in: Callable[[_T], int] | None = None,
        finish_reason: str | Callable[[], str] = "stop",
    ) -> Iterator[_T]:
        """Yield ``items`` unchanged, stamping each as it arrives; record when exhausted.

        Args:
            items: Tokens or chunks, e.g. a server's stream.
            prompt_tokens: Tokens of the prompt.
            tokens_in: Tokens in one item (default 1 per item).
            finish_reason: The reason recorded at exhaustion (or a function returning it);
                an exception records ``error``, closing the iterator early ``abort``.
        """
        r = self.request(prompt_tokens)
        start = r.start
        try:
            for item in items:
                r.token(tokens_in(item) if tokens_in is not None else 1)
                yield item
        except GeneratorExit:
            r.finish("abort")
            raise
        except BaseException:  # the stream's own error: recorded, then raised on
            r.finish("error")
            raise
        r.finish(finish_reason() if callable(finish_reason) else finish_reason)
        self._throughput(r.tokens, (r.last or start) - start)

    # --- Hugging Face -----------------------------------------------------------------
    def generate(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        """``model.generate(*args, **kwargs)``, timed token by token; returns its output.

        Each row of the batch is a request: its output tokens run to its first EOS
        (``stop``) or to the length limit (``length``). A ``stopping_criteria`` passed in is
        kept. An exception in ``generate`` records every row as ``error`` and propagates.

        Raises:
            ImportError: transformers is not installed
                (``pip install 'otel-tunix[transformers]'``).
        """
        clock = _token_clock()
        from transformers import StoppingCriteriaList

        given = kwargs.pop("stopping_criteria", None)
        criteria = StoppingCriteriaList(list(given or []))
        criteria.append(clock)
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            input_ids = kwargs.get("inputs")
        try:
            prompt_lens = _prompt_lengths(input_ids, kwargs.get("attention_mask"))
        except Exception:  # the caller's inputs, of any type: never fail the call over a count
            prompt_lens = [0]
        timers = [self.request(n) for n in prompt_lens]
        try:
            out = model.generate(*args, stopping_criteria=criteria, **kwargs)
        except BaseException:  # the model's own error: recorded, then raised on
            for t in timers:
                t.finish("error")
            raise
        end = _clock()
        try:
            self._record_generate(model, kwargs, out, input_ids, timers, clock.stamps, end)
        except Exception:  # an output (or model config) not shaped as expected
            for t in timers:
                t.finish("unknown", now=end)
            warn_once(
                (id(self), "generate"),
                "otel-tunix: could not record generation metrics (reported once)",
                logger=_logger,
                exc_info=True,
            )
        return out

    def _record_generate(
        self,
        model: Any,
        kwargs: dict[str, Any],
        out: Any,
        input_ids: Any,
        timers: list[RequestTimer],
        stamps: Sequence[float],
        end: float,
    ) -> None:
        import numpy as np  # here, not at import: ``import otel_tunix`` stays free of numpy

        sequences = getattr(out, "sequences", out)
        seq = np.asarray(sequences.detach().cpu().numpy())
        cfg = getattr(model, "config", None)
        if getattr(cfg, "is_encoder_decoder", False):
            new = seq[:, 1:]
        else:
            new = seq[:, int(input_ids.shape[-1]) :] if input_ids is not None else seq
        rows = new.shape[0]
        if rows != len(timers) and timers and rows % len(timers) == 0:  # num_return_sequences
            k = rows // len(timers)  # generate repeats each input k times, consecutively
            timers = [
                t if j == 0 else self.request(t.prompt_tokens, start=t.start)
                for t in timers
                for j in range(k)
            ]
        eos = _eos_ids(model, kwargs)
        total = 0
        for i, timer in enumerate(timers[:rows]):
            row = new[i]
            hits = np.nonzero(np.isin(row, list(eos)))[0] if eos else np.array([], dtype=int)
            if hits.size:
                n, reason = int(hits[0]) + 1, "stop"
            else:
                n, reason = int(row.shape[0]), "length"
            total += n
            for j in range(min(n, len(stamps))):
                timer.token(1, now=stamps[j])
            timer.finish(
                reason, output_tokens=n, now=stamps[n - 1] if 0 < n <= len(stamps) else end
            )
        for timer in timers[rows:]:
            timer.finish("unknown", now=end)
        self._throughput(total, end - timers[0].start if timers else 0.0)

    # --- reading ------------------------------------------------------------------------
    def stats(self) -> GenerationStats:
        """Totals so far, in process."""
        with self._lock:
            return GenerationStats(
                requests=Counter(self._requests),
                active=self._active,
                prompt_tokens=self._prompt,
                output_tokens=self._output,
                last_ttft_sec=self._last["ttft"],
                last_tpot_sec=self._last["tpot"],
                last_e2e_sec=self._last["e2e"],
                last_tokens_per_sec=self._last["tps"],
            )


def _prompt_lengths(input_ids: Any, attention_mask: Any) -> list[int]:
    if attention_mask is not None:
        return [int(x) for x in attention_mask.sum(-1).tolist()]
    if input_ids is None:
        return [0]
    shape = tuple(input_ids.shape)
    return [int(shape[-1])] * (shape[0] if len(shape) > 1 else 1)


def _eos_ids(model: Any, kwargs: dict[str, Any]) -> set[int]:
    eos = kwargs.get("eos_token_id")
    if eos is None:
        gc = kwargs.get("generation_config") or getattr(model, "generation_config", None)
        eos = getattr(gc, "eos_token_id", None)
    if eos is None:
        return set()
    if isinstance(eos, int):
        return {eos}
    if hasattr(eos, "tolist"):
        eos = eos.tolist()
    return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}


_clock_cls: type | None = None


def _token_clock() -> Any:
    """A ``transformers.StoppingCriteria`` that stamps each appended token, never stops."""
    global _clock_cls
    if _clock_cls is None:
        try:
            import torch
            from transformers import StoppingCriteria
        except ImportError as exc:
            raise ImportError(
                "GenerationMetrics.generate needs transformers and torch: "
                "pip install 'otel-tunix[transformers]'"
            ) from exc

        class _TokenClock(StoppingCriteria):
            """Stamps ``time.perf_counter()`` after each decoding step."""

            def __init__(self) -> None:
                self.stamps: list[float] = []
                self._no: Any = None

            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                if not self.stamps and input_ids.device.type != "cpu":
                    input_ids[0, -1].item()  # wait once for the prefill: TTFT is real
                self.stamps.append(_clock())
                no = self._no
                if no is None or no.shape[0] != input_ids.shape[0]:
                    no = self._no = torch.zeros(
                        input_ids.shape[0], dtype=torch.bool, device=input_ids.device
                    )
                return no

        _clock_cls = _TokenClock
    return _clock_cls()
