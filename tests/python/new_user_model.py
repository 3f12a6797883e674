#!/usr/bin/env python3
"""A new user's own model for Starling, as tests/node/new_user_test.cc makes
one: a token language model that is none of tests/fixtures' models,
defined in PyTorch, scripted and saved for `--model=torchscript:PATH`.

    new_user_model.py OUT --vocab=N

Writes OUT, a TorchScript file of TokenConvGru over a vocabulary of N
tokens (the one `starling tokenize` printed): int64 tokens [B, T] in,
logits [B, T, N] out.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class TokenConvGru(nn.Module):
    """Token embedding, a residual causal 1-D convolution (it sees the last
    `kernel` tokens), a GRU over the sequence, LayerNorm and a linear
    read-out."""

    def __init__(self, vocab: int, dim: int = 32, hidden: int = 48,
                 kernel: int = 4):
        super().__init__()
        self.kernel = kernel
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, dim, kernel)
        self.gru = nn.GRU(dim, hidden, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        c = F.pad(h.transpose(1, 2), (self.kernel - 1, 0))  # causal: left
        h = h + torch.relu(self.conv(c)).transpose(1, 2)
        h, _ = self.gru(h)
        return self.out(self.norm(h))


def main():
    # TorchScript writes module constants in set order, which follows
    # Python's string-hash seed: a fixed seed makes the file reproducible.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable] + sys.argv,
                  dict(os.environ, PYTHONHASHSEED="0"))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--vocab", type=int, required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    model = TokenConvGru(args.vocab)
    torch.jit.script(model.eval()).save(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
