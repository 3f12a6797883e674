#!/usr/bin/env python3
"""A CNN on Fashion-MNIST with a DataLoader, trained with DiLoCo by N
Python processes.

    PYTHONPATH=build/python /usr/bin/python3 \\
        examples/python/fashion_cnn.py --processes=2

One command starts N members on this machine (127.0.0.1, plaintext). Each
reads Debian's dataset-fashion-mnist, takes every N-th training image from
its rank on (its shard) through an ordinary torch DataLoader, and trains
Starling's cnn (python/starling_models.py's twin of the built-in model) with
its own Adam; `d.step(samples=len(x))` after each step runs a DiLoCo round
every --inner_steps steps. The first member prints its test accuracy.
"""
import argparse
import gzip
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# starling_models, when build/python (which has a copy) is not on the path.
sys.path.append(os.path.join(ROOT, "python"))
import swarm_launch  # noqa: E402 (beside this file)

DATA = "/usr/share/datasets/fashion-mnist"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    swarm_launch.add_member_args(ap)
    ap.add_argument("--data", default=DATA,
                    help="the directory of the idx .gz files")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--inner_steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--compression", default="fp32")
    return ap.parse_args()


def read_idx(path):
    """An idx file (images [N,1,28,28] scaled to [0,1], or labels [N])."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big")
             for i in range(dims)]
    t = torch.frombuffer(bytearray(raw[4 + 4 * dims:]), dtype=torch.uint8)
    if dims == 1:
        return t.long()
    return t.reshape(shape[0], 1, shape[1], shape[2]).float() / 255


def dataset(directory, split):
    return TensorDataset(
        read_idx(os.path.join(directory, "%s-images-idx3-ubyte.gz" % split)),
        read_idx(os.path.join(directory, "%s-labels-idx1-ubyte.gz" % split)))


@torch.no_grad()
def accuracy(model, data, limit=2000):
    model.eval()
    x, y = data.tensors[0][:limit], data.tensors[1][:limit]
    acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def member(a):
    import starling
    import starling_models

    train = dataset(a.data, "train")
    n = len(a.ports.split(","))
    mine = Subset(train, range(a.rank, len(train), n))
    loader = DataLoader(mine, batch_size=a.batch, shuffle=True,
                        generator=torch.Generator().manual_seed(a.rank))
    torch.manual_seed(0)  # every member starts from the same θ
    model = starling_models.build("cnn(classes=10)")
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    swarm = swarm_launch.swarm_for(starling, a, "fashion-cnn")
    start, step = time.time(), 0
    with starling.DiLoCo(model, opt, swarm, inner_steps=a.inner_steps,
                         compression=a.compression) as d:
        while step < a.steps:
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                r = d.step(samples=len(x))
                if r is not None:
                    print("m%d round %d %s: %d members, loss %.3f, model %s"
                          % (a.rank, r["round"], r["outcome"], r["members"],
                             loss.item(), r["model_hash"]), flush=True)
                if step == a.steps:
                    break
        if a.rank == 0:
            print("m0 test accuracy %.3f after %d steps in %.1f s" % (
                accuracy(model, dataset(a.data, "t10k")), a.steps,
                time.time() - start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(swarm_launch.main(__file__, parse_args(), member))
