"""The demos' language model: a tiny causal transformer over bytes, and the text it reads.

``TinyLM`` is a decoder-only transformer in the GPT-2 / nanoGPT shape (token and position
embeddings, pre-norm blocks of causal self-attention and a 4x MLP, the output head tied to
the token embedding) small enough to train on a CPU in seconds. Its tokens are bytes (a
vocabulary of 256) for the text demo, or any small vocabulary (the RL demo's digits).

The text is sixteen of Shakespeare's sonnets (1609, public domain), about 10 KB, shipped
in the package (``otel_tunix/data/sonnets.txt``): nothing is downloaded. Held-out windows
for evaluation come from its last tenth.

Needs torch (the ``demo`` or ``torch`` extra); the demos import this module only when they
run, so ``otel-tunix --help`` stays fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import torch
from torch import nn
from torch.nn import functional as F

from otel_tunix.metrics.flops import TransformerFlops, count_params

__all__ = ["ByteWindows", "TinyLM", "TinyLMConfig", "corpus_bytes", "split_corpus"]

CORPUS = "sonnets.txt"


def corpus_bytes() -> bytes:
    """The text shipped with the package (UTF-8 bytes)."""
    return resources.files("otel_tunix").joinpath("data", CORPUS).read_bytes()


def split_corpus(data: bytes, eval_share: float = 0.1) -> tuple[bytes, bytes]:
    """(train, eval): the last ``eval_share`` of the text is held out."""
    cut = int(len(data) * (1.0 - eval_share))
    return data[:cut], data[cut:]


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyLMConfig:
    """Shape of a :class:`TinyLM`."""

    vocab: int = 256
    """Tokens: 256 for bytes."""
    seq_len: int = 64
    """Context length (the attention window) in tokens."""
    d_model: int = 64
    """Width of the residual stream."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads; ``d_model`` must be a multiple of it."""

    def __post_init__(self) -> None:
        if min(self.vocab, self.seq_len, self.d_model, self.n_layers, self.n_heads) < 1:
            raise ValueError(f"every size of a TinyLMConfig must be >= 1: {self}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})"
            )


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x GELU MLP."""

    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        out: torch.Tensor = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return out


class TinyLM(nn.Module):
    """A decoder-only transformer: ``forward(tokens)`` gives next-token logits (B, T, V)."""

    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"{t} tokens exceed the context of {self.cfg.seq_len}")
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln(x))
        return logits

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy in nats."""
        logits = self(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def n_params(self) -> int:
        """Parameters in matmuls (the tied embedding once, position embeddings not)."""
        return count_params(self, exclude=lambda name: name.startswith("pos."))

    def flops(self) -> TransformerFlops:
        """The model's training FLOPs per token (``6N + 12·L·H·Q·T``, PaLM appendix B)."""
        c = self.cfg
        return TransformerFlops(
            self.n_params(), c.n_layers, c.n_heads, c.d_model // c.n_heads, c.seq_len
        )


class ByteWindows(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Windows of ``seq_len + 1`` bytes of a text: (tokens, next tokens).

    Window ``i`` starts at a position drawn from ``i`` (a fixed permutation of the text's
    positions), so a DataLoader with ``shuffle=False`` still sees the text in random order
    and two runs with the same ``seed`` see the same batches.
    """

    def __init__(self, data: bytes, seq_len: int, *, seed: int = 0) -> None:
        if len(data) <= seq_len + 1:
            raise ValueError(f"the text ({len(data)} bytes) is shorter than a window")
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.seq_len = seq_len
        gen = torch.Generator().manual_seed(seed)
        self.starts = torch.randperm(len(data) - seq_len - 1, generator=gen)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = int(self.starts[i % len(self.starts)])
        w = self.data[s : s + self.seq_len + 1]
        return w[:-1], w[1:]


def uniform_loss(vocab: int) -> float:
    """The loss of a model that knows nothing: ``ln(vocab)`` nats."""
    return math.log(vocab)
