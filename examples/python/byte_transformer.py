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
text's last 5%.
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
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--val_fraction", type=float, default=0.05,
                    help="the text's last part, for the validation loss")
    ap.add_argument("--compression", default="fp32")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch's intra-op threads per member")
    return ap.parse_args()


def batches(data, batch, context, gen):
    while True:
        starts = torch.randint(0, len(data) - context - 1, (batch,),
                               generator=gen)
        x = torch.stack([data[s:s + context] for s in starts.tolist()])
        y = torch.stack([data[s + 1:s + context + 1] for s in starts.tolist()])
        yield x.long(), y.long()


@torch.no_grad()
def evaluate(model, data, context, batch=64):
    """Mean loss over every non-overlapping window of the validation text
    (as `starling train` evaluates it)."""
    model.eval()
    starts = list(range(0, len(data) - context, context))
    total, count = 0.0, 0
    for i in range(0, len(starts), batch):
        s = starts[i:i + batch]
        x = torch.stack([data[j:j + context] for j in s]).long()
        y = torch.stack([data[j + 1:j + context + 1] for j in s]).long()
        logits = model(x)
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                 y.reshape(-1), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / max(1, count)


def shard_of(train, rank, members, chunk=4096):
    """Every members-th chunk of the training text from `rank` on."""
    parts = [train[i:i + chunk]
             for i in range(rank * chunk, len(train), members * chunk)]
    return torch.cat(parts)


def member(a):
    import starling
    import starling_models

    with open(a.text, "rb") as f:
        raw = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    split = int(len(raw) * (1 - a.val_fraction))
    train, val = raw[:split], raw[split:]
    mine = shard_of(train, a.rank, a.processes)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)  # every member starts from the same θ
    model = starling_models.build(ARCH)
    context = 64
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95),
                            weight_decay=a.weight_decay)
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
