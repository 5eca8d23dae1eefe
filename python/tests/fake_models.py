"""Models and training steps run both for real on the CPU and on fake CUDA tensors
(``test_fake_cuda.py``): each built on the device it trains on, its batches made there, so the
two runs make the same tensors in the same order wherever the kernels agree."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class AdamLike(torch.optim.Optimizer):
    """A hand-written Adam, as courses and research code write them: a subclass of
    ``Optimizer`` whose state (two moments per parameter) is made lazily on the first step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["t"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["t"] += 1
                t, m, v = state["t"], state["m"], state["v"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                lr = group["lr"] * math.sqrt(1 - b2**t) / (1 - b1**t)
                p.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-lr)
                p.mul_(1 - group["lr"] * group["weight_decay"])


class Block(nn.Module):
    """A pre-norm Transformer block with its attention written out (no fused kernel)."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.h)
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=x.device), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.ff(self.ln2(x))


class LM(nn.Module):
    def __init__(self, vocab=1000, d=128, h=4, n=2, ctx=64):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(ctx, d))
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.out = (
            nn.Embedding(500, 64),
            nn.LSTM(64, 128, batch_first=True),
            nn.Linear(128, 20),
        )

    def forward(self, x):
        return self.out(self.rnn(self.emb(x))[0])


MODELS = ("mlp", "cnn", "lm", "gpt2", "bert")


def make(name: str, device: str):
    """``(model, optimizer, batch, kind)``: built on ``device``; ``batch()`` makes an input
    there."""
    torch.manual_seed(0)
    with torch.device(device):
        return _make(name)


def _make(name: str):
    if name == "mlp":
        m = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
        return (
            m,
            torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
            lambda: torch.randn(16, 256),
            "mlp",
        )
    if name == "cnn":
        m = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.GroupNorm(4, 16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        return (
            m,
            torch.optim.AdamW(m.parameters(), foreach=False),
            lambda: torch.randn(8, 3, 32, 32),
            "ce",
        )
    if name == "lstm":
        m = Tagger()
        return (
            m,
            torch.optim.Adam(m.parameters(), foreach=False),
            lambda: torch.randint(0, 500, (4, 30)),
            "seq",
        )
    if name == "lm":
        m = LM()
        return m, AdamLike(m.parameters()), lambda: torch.randint(0, 1000, (4, 64)), "seq"
    import transformers

    if name == "gpt2":
        cfg = transformers.GPT2Config(
            n_layer=2,
            n_embd=128,
            n_head=4,
            vocab_size=1000,
            n_positions=64,
            attn_implementation="eager",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        m = transformers.GPT2LMHeadModel(cfg)
        return (
            m,
            torch.optim.AdamW(m.parameters(), foreach=False),
            lambda: torch.randint(0, 1000, (2, 64)),
            "hf",
        )
    if name == "bert":
        cfg = transformers.BertConfig(
            vocab_size=1000,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=256,
            max_position_embeddings=64,
            attn_implementation="eager",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        m = transformers.BertForMaskedLM(cfg)
        return (
            m,
            torch.optim.AdamW(m.parameters(), foreach=False),
            lambda: torch.randint(0, 1000, (2, 64)),
            "hf",
        )
    raise ValueError(name)


def train(model, opt, batch, kind: str, device: str, steps: int = 2) -> list:
    """``steps`` optimizer steps; the MLP accumulates two micro-batches per step under a tensor
    hook and a module's backward hook. Returns what the hooks saw (shapes)."""
    seen: list = []
    if kind == "mlp":
        model[2].register_full_backward_hook(lambda m, gi, go: seen.append(tuple(go[0].shape)))
    for _ in range(steps):
        micro = 2 if kind == "mlp" else 1
        for _ in range(micro):
            with torch.device(device):
                x = batch()
                y = torch.randint(0, 10, (x.shape[0],)) if kind in ("mlp", "ce") else x
            if kind == "hf":
                loss = model(x, labels=y).loss
            elif kind == "mlp":
                h = model[1](model[0](x))
                h.register_hook(lambda g: seen.append(tuple(g.shape)))
                loss = F.cross_entropy(model[2](h), y) / micro
            else:
                out = model(x)
                loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return seen
