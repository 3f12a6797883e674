"""One Python member of a test swarm (tests/python/test_starling.py).

Trains a small model with a BatchNorm (so that buffers are averaged too) on
its own random data with its own AdamW, calls d.step() after each inner
step, and prints one JSON line per round: {"round", "outcome", "members",
"model_hash"}, then {"done": true, "model_hash"} after leaving.
With --algo=gossip it is a starling.Gossip member instead, and prints one
line per period (what Gossip.step returns, with "loss": the period's mean)
and {"done": true, "counters", "weight", ...} after leaving.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn

import starling


def make_model(width):
    torch.manual_seed(7)  # every member starts from the same θ
    return nn.Sequential(nn.Linear(8, width), nn.BatchNorm1d(width),
                         nn.ReLU(), nn.Linear(width, 2))


def gossip(a, model, opt, swarm, architecture, train_step):
    """A starling.Gossip member for --rounds periods."""
    losses = []
    with starling.Gossip(model, opt, swarm, inner_steps=a.inner_steps,
                         compression=a.compression,
                         gossip_peers=a.gossip_peers,
                         gossip_momentum=a.gossip_momentum or None,
                         architecture=architecture,
                         metrics_port=a.metrics_port) as g:
        print(json.dumps({"address": g.address, "model_hash": g.model_hash,
                          "architecture": g.architecture,
                          "metrics": g.metrics_address}), flush=True)
        while g.periods < a.rounds:
            loss = train_step()
            losses.append(float(loss))
            r = g.step(samples=32, loss=loss)
            if r is not None:
                r["loss"] = sum(losses) / len(losses)
                losses = []
                r["peers"] = {m["id"]: m["state"] for m in g.members()}
                print(json.dumps(r), flush=True)
        done = {"done": True, "model_hash": g.model_hash,
                "counters": g.counters, "weight": g.weight,
                "params": [round(v, 6) for v in torch.cat(
                    [p.detach().reshape(-1) for p in model.parameters()])
                    .tolist()[:64]]}
    print(json.dumps(done), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--node_id", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--peers", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner_steps", type=int, default=5)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--min_members", type=int, default=1)
    ap.add_argument("--compression", default="fp32")
    ap.add_argument("--data_seed", type=int, default=0)
    ap.add_argument("--step_sleep", type=float, default=0)
    ap.add_argument("--gossip_peers", default="random")
    ap.add_argument("--gossip_momentum", type=float, default=0)
    ap.add_argument("--out", default=None,
                    help="checkpoint into this run directory, every round")
    ap.add_argument("--metrics_port", type=int, default=None)
    ap.add_argument("--health_port", type=int, default=None)
    ap.add_argument("--algo", default="diloco", choices=["diloco", "gossip"])
    ap.add_argument("--text", default="",
                    help="with --torchscript: train on windows of this "
                         "file's bytes, not on random bytes")
    ap.add_argument("--torchscript", default="",
                    help="train this TorchScript byte LM (int64 [B,T] -> "
                         "logits [B,T,256]) instead, named as `starling "
                         "node --model=torchscript:PATH` names it")
    a = ap.parse_args()
    architecture = None
    if a.torchscript:
        model = torch.jit.load(a.torchscript)
        architecture = starling.torchscript_architecture(a.torchscript)
    else:
        model = make_model(a.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + a.data_seed)
    swarm = starling.Swarm(node_id=a.node_id, listen=a.listen,
                           peers=a.peers or None, run_id="pytest",
                           insecure=True, min_members=a.min_members,
                           connect_timeout=60)
    text = None
    if a.text:
        with open(a.text, "rb") as f:
            text = torch.tensor(list(f.read()), dtype=torch.int64)

    def train_step():
        if a.torchscript:
            if text is not None:
                at = torch.randint(0, len(text) - 17, (32,), generator=gen)
                x = torch.stack([text[i:i + 17] for i in at.tolist()])
            else:
                x = torch.randint(0, 256, (32, 17), generator=gen)
            logits = model(x[:, :-1])
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, 256), x[:, 1:].reshape(-1))
        else:
            x = torch.randn(32, 8, generator=gen)
            y = (x.sum(1) > 0).long()
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if a.step_sleep:
            time.sleep(a.step_sleep)
        return loss

    if a.algo == "gossip":
        return gossip(a, model, opt, swarm, architecture, train_step)
    with starling.DiLoCo(model, opt, swarm, inner_steps=a.inner_steps,
                         compression=a.compression, outer_lr=0.7,
                         outer_momentum=0.9, architecture=architecture,
                         out=a.out, resume_if_exists=bool(a.out) or None,
                         checkpoint_every=a.inner_steps if a.out else None,
                         metrics_port=a.metrics_port,
                         health_port=a.health_port) as d:
        print(json.dumps({"address": d.address, "model_hash": d.model_hash,
                          "architecture": d.architecture, "round": d.round,
                          "resumed": d.resumed,
                          "health": d.health_address,
                          "metrics": d.metrics_address}), flush=True)
        rounds = 0
        while rounds < a.rounds:
            loss = train_step()
            r = d.step(samples=32, loss=loss)
            if r is not None:
                # What the model's own tensors hold now (θ_global and the
                # averaged buffers, without error feedback's residual).
                r["tensors_hash"] = starling.model_hash(model)
                r["peers"] = {m["id"]: m["state"] for m in d.members()}
                if r["outcome"] == "committed":
                    rounds += 1
                print(json.dumps(r), flush=True)
        final = d.model_hash
    print(json.dumps({"done": True, "model_hash": final}), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the `with` block has left the swarm
        print(json.dumps({"interrupted": True}), flush=True)
        sys.exit(130)
