#!/usr/bin/env python3
"""What Starling's export tests check with Debian's python3-torch: that a
model `starling export` wrote loads and computes what Starling computed.

    export_check.py eval --model=FILE [--architecture=ARCH]
                         (--text=PATH | --tokens=PATH [--token_dtype=T]
                          [--val_tokens=PATH])
                         --context=N [--val_fraction=F]
        Loads FILE (a TorchScript file, or with --architecture a state_dict
        for python/starling_models.py, loaded with strict=True) and prints
        {"val_loss": L, "examples": N}: the mean cross-entropy over the
        validation windows Starling holds out (core/data.cc), in eval mode:
        of text:PATH, the last val_fraction of its bytes; of tokens:PATH
        (little-endian uint16 or uint32 ids, as `starling tokenize` writes
        them), the last val_fraction of its tokens, or with --val_tokens
        that file's tokens (--val_data=tokens:PATH). Windows of `context`.
    export_check.py buffers FILE...
        TorchScript files: prints {"names": [...], "max_diff": D,
        "moved": M}: the largest difference of any buffer between the files,
        and whether the first file's floating buffers moved from
        BatchNorm's initial values (means 0, variances 1).
    export_check.py parity --model=FILE --architecture=ARCH --io=FILE
        --io holds {"x": input, "logits": Starling's logits} (torch.load);
        prints {"max_abs_diff": D} between those logits and the Python
        class's on the same input.
Exit status 0 once it printed its JSON line; a failure to load raises.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))
import starling_models  # noqa: E402


def load(path, architecture):
    if architecture:
        model = starling_models.build(architecture)
        model.load_state_dict(torch.load(path), strict=True)
    else:
        model = torch.jit.load(path)
    return model.eval()


def read_tokens(path, dtype):
    """A token file's ids: little-endian `dtype` integers."""
    with open(path, "rb") as f:
        raw = f.read()
    width = {"uint16": 2, "uint32": 4}[dtype]
    if len(raw) % width != 0:
        raise SystemExit(f"{path}: not a whole number of {dtype} tokens")
    return torch.tensor([int.from_bytes(raw[i:i + width], "little")
                         for i in range(0, len(raw), width)],
                        dtype=torch.int64)


def val_windows(args):
    """Starling's validation windows (core/data.cc's TokenDataset): the
    inputs and their next-token targets."""
    context = args.context
    if args.text:
        with open(args.text, "rb") as f:
            tokens = torch.tensor(list(f.read()), dtype=torch.int64)
    else:
        tokens = read_tokens(args.tokens, args.token_dtype)
    n = tokens.numel()
    split = int(float(n) * (1.0 - args.val_fraction))
    if args.val_tokens:
        split = n
        tokens = torch.cat([tokens,
                            read_tokens(args.val_tokens, args.token_dtype)])
        n = tokens.numel()
    count = (n - split - 1) // context
    starts = [split + i * context for i in range(count)]
    x = torch.stack([tokens[s:s + context] for s in starts])
    y = torch.stack([tokens[s + 1:s + context + 1] for s in starts])
    return x, y


def cmd_eval(args):
    model = load(args.model, args.architecture)
    x, y = val_windows(args)
    loss_sum, targets = 0.0, 0
    with torch.no_grad():
        # Batches of 64, as Starling's Trainer::Evaluate sums them.
        for begin in range(0, x.size(0), 64):
            logits = model(x[begin:begin + 64])
            flat = logits.reshape(-1, logits.size(-1))
            t = y[begin:begin + 64].reshape(-1)
            loss_sum += F.cross_entropy(flat, t, reduction="sum").item()
            targets += t.numel()
    print(json.dumps({"val_loss": loss_sum / targets,
                      "examples": x.size(0)}))


def cmd_buffers(args):
    models = [torch.jit.load(p) for p in args.files]
    named = [dict(m.named_buffers()) for m in models]
    max_diff = 0.0
    for other in named[1:]:
        if other.keys() != named[0].keys():
            raise SystemExit("the files have different buffers")
        for k, v in named[0].items():
            d = (v.double() - other[k].double()).abs().max().item()
            max_diff = max(max_diff, d)
    moved = False
    for k, v in named[0].items():
        if k.endswith("running_mean"):
            moved = moved or bool((v != 0).any())
        if k.endswith("running_var"):
            moved = moved or bool((v != 1).any())
    print(json.dumps({"names": sorted(named[0].keys()), "max_diff": max_diff,
                      "moved": moved}))


def cmd_parity(args):
    model = load(args.model, args.architecture)
    io = torch.load(args.io)
    with torch.no_grad():
        logits = model(io["x"])
    print(json.dumps({
        "max_abs_diff": (logits - io["logits"]).abs().max().item(),
        "shape": list(logits.shape)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--model", required=True)
    e.add_argument("--architecture", default="")
    data = e.add_mutually_exclusive_group(required=True)
    data.add_argument("--text")
    data.add_argument("--tokens")
    e.add_argument("--token_dtype", default="uint16",
                   choices=["uint16", "uint32"])
    e.add_argument("--val_tokens", default="")
    e.add_argument("--context", type=int, required=True)
    e.add_argument("--val_fraction", type=float, default=0.05)
    b = sub.add_parser("buffers")
    b.add_argument("files", nargs="+")
    q = sub.add_parser("parity")
    q.add_argument("--model", required=True)
    q.add_argument("--architecture", required=True)
    q.add_argument("--io", required=True)
    args = p.parse_args()
    {"eval": cmd_eval, "buffers": cmd_buffers, "parity": cmd_parity}[
        args.cmd](args)


if __name__ == "__main__":
    main()
