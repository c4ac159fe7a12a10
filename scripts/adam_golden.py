#!/usr/bin/python3
"""Write golden Adam/AdamW trajectories computed by PyTorch.

Runs torch.optim.Adam and torch.optim.AdamW (single-tensor implementation,
foreach=False, on CPU) over a few small tensors with odd sizes for several
steps with fixed, seeded gradients, and writes every step's params, exp_avg
and exp_avg_sq as float32 bit patterns (integers, so the file is exact) to
swapper/optimizer/testdata/adam_golden.json. The Go test
TestAdamMatchesPyTorch replays the gradients through the optimizer and
compares.

zinf's Hyper holds float32 hyperparameters (as DeepSpeed's CPU Adam does);
PyTorch takes Python floats (doubles). Each case therefore hands PyTorch the
float32 values zinf will hold, so the comparison is of the update rule, not
of how 0.999 rounds.

Usage: /usr/bin/python3 scripts/adam_golden.py [output path]
(Debian: apt-get install python3-torch)
"""

import json
import os
import struct
import sys

import torch

STEPS = 10
SIZES = [1, 7, 33]


def f32(x):
    """The float32 nearest x, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def tensor_bits(t):
    return [bits(v) for v in t.detach().to(torch.float32).flatten().tolist()]


CASES = [
    # name, class, lr, betas, eps, weight_decay
    ("adam_default", torch.optim.Adam, 1e-3, (0.9, 0.999), 1e-8, 0.0),
    ("adam_l2_nondefault", torch.optim.Adam, 3e-3, (0.8, 0.99), 1e-6, 0.1),
    ("adamw_wd0", torch.optim.AdamW, 1e-2, (0.9, 0.999), 1e-8, 0.0),
    ("adamw_wd", torch.optim.AdamW, 1e-2, (0.9, 0.999), 1e-8, 0.01),
]


def run_case(seed, name, cls, lr, betas, eps, wd):
    lr, b1, b2, eps, wd = f32(lr), f32(betas[0]), f32(betas[1]), f32(eps), f32(wd)
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(n, generator=gen, dtype=torch.float32) for n in SIZES]
    init = [tensor_bits(p) for p in params]
    grads = [[] for _ in SIZES]
    traj = {k: [[] for _ in SIZES] for k in ("param", "exp_avg", "exp_avg_sq")}
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = cls(ps, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)
    for _ in range(STEPS):
        for i, p in enumerate(ps):
            g = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1
            g[::5] = 0.0  # zeros exercise the eps path
            p.grad = g
            grads[i].append(tensor_bits(g))
        opt.step()
        for i, p in enumerate(ps):
            st = opt.state[p]
            traj["param"][i].append(tensor_bits(p))
            traj["exp_avg"][i].append(tensor_bits(st["exp_avg"]))
            traj["exp_avg_sq"][i].append(tensor_bits(st["exp_avg_sq"]))
    tensors = []
    for i, n in enumerate(SIZES):
        tensors.append({"n": n, "init": init[i], "grads": grads[i], "param": traj["param"][i],
                        "exp_avg": traj["exp_avg"][i], "exp_avg_sq": traj["exp_avg_sq"][i]})
    return {"name": name, "adamw": cls is torch.optim.AdamW, "lr": bits(lr), "beta1": bits(b1),
            "beta2": bits(b2), "eps": bits(eps), "weight_decay": bits(wd), "steps": STEPS, "tensors": tensors}


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "swapper", "optimizer", "testdata", "adam_golden.json")
    torch.set_num_threads(1)
    doc = {
        "generator": "scripts/adam_golden.py",
        "torch": torch.__version__,
        "note": "float32 values as uint32 bit patterns; per tensor, grads/param/exp_avg/exp_avg_sq hold one array per step",
        "cases": [run_case(100 + k, *c) for k, c in enumerate(CASES)],
    }
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
