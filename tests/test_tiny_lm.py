"""The demos' tiny language model: its text, its windows, its FLOPs and that it learns."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from otel_tunix.demos.tiny_lm import (  # noqa: E402
    ByteWindows,
    TinyLM,
    TinyLMConfig,
    corpus_bytes,
    split_corpus,
    uniform_loss,
)
from otel_tunix.metrics.flops import measure_torch_flops  # noqa: E402


def test_the_shipped_text_is_small_utf8_and_split_at_its_last_tenth() -> None:
    data = corpus_bytes()
    assert 5_000 < len(data) < 50_000
    assert "Shall I compare thee to a summer's day?" in data.decode("utf-8")
    train, held_out = split_corpus(data)
    assert train + held_out == data
    assert len(held_out) == len(data) - int(len(data) * 0.9)


def test_windows_are_the_text_shifted_by_one_in_a_seeded_order() -> None:
    data = corpus_bytes()
    ds = ByteWindows(data, 16, seed=3)
    assert len(ds) == len(data) - 17
    x, y = ds[5]
    start = int(ds.starts[5])
    assert bytes(x.tolist()) == data[start : start + 16]
    assert bytes(y.tolist()) == data[start + 1 : start + 17]
    assert torch.equal(ByteWindows(data, 16, seed=3).starts, ds.starts)
    assert not torch.equal(ByteWindows(data, 16, seed=4).starts, ds.starts)


def test_the_model_is_causal_and_starts_at_the_uniform_loss() -> None:
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=16, d_model=32, n_heads=4))
    x = torch.randint(0, 256, (2, 16))
    changed = x.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    with torch.no_grad():
        a, b = model(x), model(changed)
        # positions before the change see the same prefix: same logits
        assert torch.allclose(a[:, :10], b[:, :10])
        assert not torch.allclose(a[:, 10:], b[:, 10:])
        # weights drawn with std 0.02: the first loss is ln(256) give or take a little
        y = torch.randint(0, 256, (2, 16))
        assert model.loss(x, y).item() == pytest.approx(uniform_loss(256), abs=0.05)
    with pytest.raises(ValueError, match="exceed the context"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of n_heads"):
        TinyLMConfig(d_model=30, n_heads=4)


def test_flops_per_token_matches_what_torch_counts_for_a_training_step() -> None:
    cfg = TinyLMConfig(seq_len=32, d_model=64, n_layers=2, n_heads=4)
    model = TinyLM(cfg)
    flops = model.flops()
    # matmul parameters: 12·d² per block (qkv, proj, 4x MLP) + the tied head, no position
    assert flops.n_params == sum(p.numel() for p in model.parameters()) - 32 * 64
    assert flops.n_params == pytest.approx(2 * 12 * 64 * 64 + 256 * 64, rel=0.02)
    x = torch.randint(0, 256, (4, 32))

    def step() -> None:
        model.loss(x, x).backward()

    counted = measure_torch_flops(step) / x.numel()
    assert counted == pytest.approx(flops.per_token(), rel=0.1)


def test_it_learns_the_text() -> None:
    torch.manual_seed(0)
    cfg = TinyLMConfig(seq_len=32, d_model=32, n_heads=4, n_layers=1)
    model = TinyLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train, _ = split_corpus(corpus_bytes())
    loader = torch.utils.data.DataLoader(ByteWindows(train, cfg.seq_len), batch_size=16)
    losses = []
    for _, (x, y) in zip(range(200), loader, strict=False):
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # from knowing nothing (ln 256 = 5.5 nats) to below the text's byte-unigram entropy
    counts = torch.bincount(torch.tensor(list(train)), minlength=256).double()
    p = counts[counts > 0] / counts.sum()
    unigram = float(-(p * p.log()).sum())
    assert losses[0] == pytest.approx(math.log(256), abs=0.05)
    assert sum(losses[-5:]) / 5 < unigram
