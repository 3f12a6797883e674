#!/usr/bin/env python3
"""Plain-PyTorch reference for the `starling train` KJV recipe (parity + timing).

Trains a small byte-level decoder-only transformer ("gpt") on the King James
Bible and reports the final validation loss (nats/byte) and training speed.
The C++ trainer implements exactly the same recipe; see the spec below.

    /usr/bin/python3 bench/pytorch_kjv.py --seed 0 --json out.json

Spec (keep identical to the C++ implementation):
  * Data: raw bytes of `bible -f "Gen1:1-Rev22:21"` as uint8 token ids.
    train = data[:floor(len*0.95)], val = the rest.
  * Model: tok_emb(256,W) + pos_emb(C,W); L pre-LN blocks
    (x += proj(attn(ln1(x))); x += fc2(gelu(fc1(ln2(x))))); ln_f; head(W,256).
    Default PyTorch init, no dropout, untied head with bias.
  * AdamW(betas=(0.9,0.95), wd=0.1) on all params, linear warmup then cosine
    decay to 0, grad-norm clipping, mean cross-entropy over all positions.
  * Validation: non-overlapping windows of C+1 bytes (stride C), batches of 64,
    mean CE over all predicted positions.
  * Timing: mean ms per training step, excluding eval and the first 10 steps.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

DEFAULT_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
    "starling", "kjv.txt")
WARMUP_STEPS_EXCLUDED = 10  # steps left out of the timing average
EVAL_BATCH = 64             # validation windows per forward pass


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------
def load_data(path):
    """Return the corpus bytes; create the cache from `bible` if missing."""
    if not os.path.exists(path):
        print(f"creating {path} from `bible`", flush=True)
        raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"],
                             check=True, stdout=subprocess.PIPE).stdout
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)  # atomic: never leave a half-written cache
    with open(path, "rb") as f:
        return f.read()


def split_data(raw):
    """uint8 token tensor -> (train, val), split at floor(len * 0.95)."""
    data = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
    split = int(math.floor(len(data) * 0.95))
    return data[:split], data[split:]


class Sampler:
    """Uniform random training windows: start s in [0, len-context-1]."""

    def __init__(self, train, batch, context, seed):
        self.train = train.long()
        self.batch, self.context = batch, context
        self.high = len(train) - context - 1  # inclusive upper bound
        self.rng = np.random.default_rng(seed)
        self.offsets = torch.arange(context + 1)

    def next(self):
        starts = torch.from_numpy(
            self.rng.integers(0, self.high + 1, size=self.batch))
        win = self.train[starts[:, None] + self.offsets]  # [B, C+1]
        return win[:, :-1], win[:, 1:]


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------
# The model is Starling's `gpt` as python/starling_models.py defines it (the
# classes `starling export`'s state_dicts load into): same parameters, same
# registration order, so the same default init for the same seed.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "python"))
from starling_models import Gpt  # noqa: E402


def loss_fn(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# --------------------------------------------------------------------------
# Training helpers
# --------------------------------------------------------------------------
def lr_at(step, args):
    """Linear warmup for `warmup` steps, then cosine decay to zero."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate(model, val, context):
    """Mean CE (nats/byte) over non-overlapping windows of the val split."""
    model.eval()
    val = val.long()
    n_windows = (len(val) - 1) // context
    idx = torch.arange(n_windows)[:, None] * context + torch.arange(context + 1)
    windows = val[idx]  # [n_windows, context+1]
    total, count = 0.0, 0
    for i in range(0, n_windows, EVAL_BATCH):
        w = windows[i:i + EVAL_BATCH]
        x, y = w[:, :-1], w[:, 1:]
        logits = model(x)
        total += F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1),
                                 reduction="sum").item()
        count += y.numel()
    model.train()
    return total / count


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--data", default=DEFAULT_CACHE,
                   help="corpus file (created from `bible` if absent)")
    p.add_argument("--json", default=None, help="also write results here")
    p.add_argument("--eval_every", type=int, default=200)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    train, val = split_data(load_data(args.data))
    print(f"data: {len(train)} train bytes, {len(val)} val bytes", flush=True)

    torch.manual_seed(args.seed)
    model = Gpt(layers=args.layers, width=args.width, heads=args.heads,
                context=args.context)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params: {n_params:,}", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                            betas=(0.9, 0.95), weight_decay=0.1)
    sampler = Sampler(train, args.batch, args.context, args.seed)

    step_times, val_loss = [], float("nan")
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = sampler.next()
        lr = lr_at(step, args)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        loss_value = loss.item()
        if step >= WARMUP_STEPS_EXCLUDED:
            step_times.append(time.perf_counter() - t0)

        done = step + 1
        if done % 50 == 0 or done == 1:
            print(f"step {done:5d}  loss {loss_value:.4f}  lr {lr:.2e}",
                  flush=True)
        if done % args.eval_every == 0 or done == args.steps:
            val_loss = evaluate(model, val, args.context)
            print(f"step {done:5d}  val_loss {val_loss:.4f}", flush=True)

    ms = 1000.0 * sum(step_times) / max(1, len(step_times))
    result = {
        "impl": "pytorch",
        "torch_version": torch.__version__,
        "threads": args.threads,
        "steps": args.steps,
        "params": n_params,
        "final_val_loss": val_loss,
        "ms_per_step": ms,
        "tokens_per_second": args.batch * args.context / (ms / 1000.0)
        if ms > 0 else float("nan"),
        "seed": args.seed,
    }
    text = json.dumps(result, indent=2)
    print(text, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
