"""Starling's built-in models as PyTorch modules, to load what
`starling export` writes for them.

`starling export` writes a run's built-in model (`--model=gpt`, `cnn` or
`mlp`) as a PyTorch state_dict. The classes here have the same parameter
names and shapes as Starling's C++ models (core/model.cc) and compute the
same forward pass, so:

    import torch, starling_models
    model = starling_models.build("gpt(layers=2,width=64,heads=4,context=64,vocab=256)")
    model.load_state_dict(torch.load("model.pt"), strict=True)
    model.eval()

The string is the model's architecture, as `starling export` prints it (and
as summary.json's model.architecture holds it). A TorchScript model
(`--model=torchscript:PATH`) comes back as a TorchScript file instead:
`torch.jit.load("model.pt")` needs no class.

Inputs and outputs are Starling's: gpt takes int64 tokens [B, T] (T at most
the context) and returns logits [B, T, vocab]; cnn and mlp take float images
[B, 1, 28, 28] scaled to [0, 1] and return logits [B, classes].
"""

import math
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Mlp", "Cnn", "Gpt", "build"]


class Mlp(nn.Module):
    """Starling's `mlp`: 784 -> hidden -> classes, ReLU."""

    def __init__(self, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Cnn(nn.Module):
    """Starling's `cnn`: two 3x3 conv + max-pool stages, then two linears."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal multi-head attention and a 4x
    GELU MLP, x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        hd = c // self.heads
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)

        def split(z):
            return z.view(b, t, self.heads, hd).transpose(1, 2)

        q, k, v = split(q), split(k), split(v)
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, c)
        h = x + self.proj(y)
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


class Gpt(nn.Module):
    """Starling's `gpt`: token and position embeddings, `layers` blocks
    (named block0, block1, ... as in Starling), a final LayerNorm and a
    linear head."""

    def __init__(self, layers: int = 2, width: int = 64, heads: int = 4,
                 context: int = 64, vocab: int = 256):
        super().__init__()
        if width % heads != 0:
            raise ValueError(f"width {width} must be divisible by heads {heads}")
        self.layers = layers
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb = nn.Embedding(context, width)
        for i in range(layers):
            setattr(self, f"block{i}", Block(width, heads))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        pos = torch.arange(t, device=x.device)
        h = self.tok_emb(x) + self.pos_emb(pos)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        for i in range(self.layers):
            h = getattr(self, f"block{i}")(h, mask)
        return self.head(self.ln_f(h))


_CLASSES = {"mlp": Mlp, "cnn": Cnn, "gpt": Gpt}


def build(architecture: str) -> nn.Module:
    """The module for Starling's architecture string, e.g.
    "gpt(layers=2,width=64,heads=4,context=64,vocab=256)",
    "cnn(classes=10)" or "mlp(hidden=128,classes=10)"."""
    m = re.fullmatch(r"\s*(\w+)\((.*)\)\s*", architecture)
    if m is None or m.group(1) not in _CLASSES:
        raise ValueError(
            f"{architecture!r} is not a built-in Starling model "
            "(gpt(...), cnn(...) or mlp(...)); a TorchScript model loads "
            "with torch.jit.load")
    kwargs = {}
    for item in filter(None, m.group(2).split(",")):
        key, _, value = item.partition("=")
        kwargs[key.strip()] = int(value)
    model = _CLASSES[m.group(1)](**kwargs)
    # Its name in a swarm's handshake (the `starling` module's DiLoCo reads
    # it), so that it can join `starling node` members of this model.
    model.starling_architecture = architecture.strip()
    return model
