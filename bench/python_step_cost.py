#!/usr/bin/env python3
"""The cost of one `d.step()` call of the `starling` module without a round.

A lone member (a tiny model, inner_steps=10**9 so that no round runs, the
metrics on) calls d.step() --calls times, bare and with samples= and loss=
(which feed starling_tokens_total and starling_train_loss), and prints one
JSON object of microseconds per call.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_step_cost.py
"""
import argparse
import json
import socket
import time

import torch

import starling


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    swarm = starling.Swarm(node_id="a", listen="127.0.0.1:%d" % port,
                           insecure=True)
    out = {"calls": a.calls}
    with starling.DiLoCo(model, opt, swarm, inner_steps=10**9,
                         metrics_port=0) as d:
        for label, kw in (("step_us", {}),
                          ("step_samples_loss_us", {"samples": 16,
                                                    "loss": 2.5})):
            t = time.perf_counter()
            for _ in range(a.calls):
                d.step(**kw)
            out[label] = round((time.perf_counter() - t) / a.calls * 1e6, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
