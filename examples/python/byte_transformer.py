#!/usr/bin/env python3
"""A byte-level transformer trained with DiLoCo by N Python processes.

    PYTHONPATH=build/python /usr/bin/python3 \\
        examples/python/byte_transformer.py --processes=4 --text=FILE

One command starts N members on this machine (127.0.0.1, plaintext): each
trains Starling's gpt (python/starling_models.py's twin of the built-in
model, so the same fingerprint as `starling node --model=gpt`) on its own
shard of the text's bytes with its own AdamW, in its own ordinary PyTorch
loop; every --inner_steps steps `d.step()` runs a DiLoCo round in C++ that
averages the members' pseudo-gradients and applies the outer step. Each
member prints its round results; the first also its validation loss on the
text's last 10%.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# starling_models, when build/python (which has a copy) is not on the path.
sys.path.append(os.path.join(ROOT, "python"))
import swarm_launch  # noqa: E402 (beside this file)

ARCH = "gpt(layers=2,width=64,heads=4,context=64,vocab=256)"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    swarm_launch.add_member_args(ap)
    ap.add_argument("--text", default=os.path.join(ROOT, "README.md"),
                    help="the text file to learn (bytes)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--inner_steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--compression", default="fp32")
    return ap.parse_args()


def batches(data, batch, context, gen):
    while True:
        starts = torch.randint(0, len(data) - context - 1, (batch,),
                               generator=gen)
        x = torch.stack([data[s:s + context] for s in starts.tolist()])
        y = torch.stack([data[s + 1:s + context + 1] for s in starts.tolist()])
        yield x.long(), y.long()


@torch.no_grad()
def evaluate(model, data, context, batches_max=20):
    model.eval()
    losses = []
    for i in range(0, min(len(data) - context - 1, batches_max * context * 16),
                   context * 16):
        starts = range(i, min(i + context * 16, len(data) - context - 1),
                       context)
        x = torch.stack([data[s:s + context] for s in starts]).long()
        y = torch.stack([data[s + 1:s + context + 1] for s in starts]).long()
        logits = model(x)
        losses.append(F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                      y.reshape(-1)).item())
    model.train()
    return sum(losses) / max(1, len(losses))


def member(a):
    import starling
    import starling_models

    with open(a.text, "rb") as f:
        raw = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    split = int(len(raw) * 0.9)
    train, val = raw[:split], raw[split:]
    shard = len(train) // a.processes
    mine = train[a.rank * shard:(a.rank + 1) * shard]
    torch.manual_seed(0)  # every member starts from the same θ
    model = starling_models.build(ARCH)
    context = 64
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    warmup = min(50, a.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else
        0.5 * (1 + math.cos(math.pi * (s - warmup) /
                            max(1, a.steps - warmup))))
    swarm = swarm_launch.swarm_for(starling, a, "byte-transformer")
    gen = torch.Generator().manual_seed(1000 + a.rank)
    data = batches(mine, a.batch, context, gen)
    start = time.time()
    with starling.DiLoCo(model, opt, swarm, inner_steps=a.inner_steps,
                         compression=a.compression) as d:
        losses = []
        for step in range(a.steps):
            x, y = next(data)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                   y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            r = d.step(samples=a.batch)
            if r is not None:
                print("m%d round %d %s: %d members, train loss %.3f, model %s "
                      "(%.2f s exchange)" % (
                          a.rank, r["round"], r["outcome"], r["members"],
                          sum(losses) / len(losses), r["model_hash"],
                          r["seconds"]), flush=True)
                losses = []
        if a.rank == 0:
            print("m0 val_loss %.4f after %d steps in %.1f s" % (
                evaluate(model, val, context), a.steps, time.time() - start),
                flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(swarm_launch.main(__file__, parse_args(), member))
