#!/usr/bin/python3
"""Write golden SGD, Adagrad and Lion trajectories for zinf's optimizer.

SGD and Adagrad come from torch.optim.SGD and torch.optim.Adagrad
(single-tensor implementation, foreach=False, on CPU). PyTorch has no Lion;
its trajectories come from the paper's formula (Chen et al., "Symbolic
Discovery of Optimization Algorithms", 2023, Program 1, weight decay
decoupled as in the paper) written with torch float32 tensor ops:

    c = m*beta1 + g*(1-beta1)
    p = p*(1 - lr*wd)
    p = p - lr*sign(c)
    m = m*beta2 + g*(1-beta2)

Each case runs a few small tensors of odd sizes for several steps with
fixed, seeded gradients (some zero) and writes every step's params and
states as float32 bit patterns to
swapper/optimizer/testdata/optimizer_golden.json; the Go test
TestRulesMatchPyTorch replays the gradients and compares. Like
adam_golden.py, each case hands PyTorch the float32 hyperparameters zinf
holds, so the comparison is of the update rule; except the cases in
FLOAT64_CASES, which hand PyTorch the hyperparameters as the Python
floats a user writes (torch.optim.Adagrad computes its decayed rate
clr = lr/(1+(step-1)*lr_decay) from them in double), and record lr and
lr_decay as float64 too ("lr_f64", "lr_decay_f64"), so the test steps
zinf with the float64 values a schedule hands it (StepParams.LR64).

Usage: /usr/bin/python3 scripts/optimizer_golden.py [output path]
(Debian: apt-get install python3-torch)
"""

import json
import os
import sys

import torch

# The float32 helpers, step count and tensor sizes of the Adam goldens
# (this directory is on sys.path when a script in it runs).
from adam_golden import SIZES, STEPS, bits, f32, tensor_bits


class Lion:
    """Lion from the paper's formula, in float32 torch ops."""

    def __init__(self, params, lr, betas, weight_decay):
        self.params, self.lr, self.betas, self.wd = params, lr, betas, weight_decay
        self.state = {p: {"exp_avg": torch.zeros_like(p)} for p in params}

    @torch.no_grad()
    def step(self):
        b1, b2 = self.betas
        for p in self.params:
            m = self.state[p]["exp_avg"]
            c = m.mul(b1).add(p.grad, alpha=1 - b1)
            if self.wd != 0:
                p.mul_(1 - self.lr * self.wd)
            p.add_(torch.sign(c), alpha=-self.lr)
            m.mul_(b2).add_(p.grad, alpha=1 - b2)


CASES = [
    # name, rule, hyperparameters (as zinf names them)
    ("sgd_plain", "sgd", dict(lr=0.1)),
    ("sgd_momentum_dampening_wd", "sgd", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd_nesterov_wd", "sgd", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02)),
    ("adagrad_default", "adagrad", dict(lr=1e-2, eps=1e-10)),
    ("adagrad_decay_wd_init", "adagrad", dict(lr=0.05, lr_decay=0.1, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-6)),
    ("lion", "lion", dict(lr=1e-3, betas=(0.9, 0.99))),
    ("lion_wd", "lion", dict(lr=3e-3, betas=(0.95, 0.98), weight_decay=0.1)),
    # lr and lr_decay not float32 numbers: zinf rounding them before
    # computing clr drifted up to 64 ulp from torch after 6 steps.
    ("adagrad_decay_float64", "adagrad", dict(lr=0.05, lr_decay=0.1, initial_accumulator_value=0.1, eps=1e-6)),
    ("adagrad_strong_decay_float64", "adagrad", dict(lr=0.3, lr_decay=0.7, eps=1e-10)),
    # A probe of the decayed rate itself: params 0, eps 1, one gradient of
    # 1 per element, element k at step k+1 (0 elsewhere), so that step's
    # update is exactly -clr/2 and nothing else moves the element: the
    # param is torch's float32 clr of every step, compared bit for bit.
    # At lr 0.3, lr_decay 0.7 the clr computed from their float32
    # roundings differs in steps 4, 5, 7, 8 and 10.
    ("adagrad_clr_probe_float64", "adagrad", dict(lr=0.3, lr_decay=0.7, eps=1.0)),
]

# The cases whose hyperparameters PyTorch gets as float64 (see the
# docstring).
FLOAT64_CASES = {"adagrad_decay_float64", "adagrad_strong_decay_float64", "adagrad_clr_probe_float64"}

# The probe cases (see CASES), compared without tolerance.
PROBE_CASES = {"adagrad_clr_probe_float64"}

STATE_NAMES = {"sgd": ["momentum_buffer"], "adagrad": ["sum"], "lion": ["exp_avg"]}


def run_case(seed, name, rule, hp):
    given = dict(hp)
    hp = {k: (f32(v) if isinstance(v, float) else tuple(f32(x) for x in v) if isinstance(v, tuple) else v) for k, v in hp.items()}
    if name in FLOAT64_CASES:
        given, hp = hp, given  # torch gets the Python floats; the bits stay float32
    gen = torch.Generator().manual_seed(seed)
    probe = name in PROBE_CASES
    sizes = [STEPS] if probe else SIZES
    params = [torch.zeros(n, dtype=torch.float32) if probe else torch.randn(n, generator=gen, dtype=torch.float32) for n in sizes]
    init = [tensor_bits(p) for p in params]
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    if rule == "sgd":
        opt = torch.optim.SGD(ps, lr=hp["lr"], momentum=hp.get("momentum", 0.0), dampening=hp.get("dampening", 0.0),
                              weight_decay=hp.get("weight_decay", 0.0), nesterov=hp.get("nesterov", False), foreach=False)
        names = ["momentum_buffer"] if hp.get("momentum", 0.0) != 0 else []
    elif rule == "adagrad":
        opt = torch.optim.Adagrad(ps, lr=hp["lr"], lr_decay=hp.get("lr_decay", 0.0), weight_decay=hp.get("weight_decay", 0.0),
                                  initial_accumulator_value=hp.get("initial_accumulator_value", 0.0), eps=hp["eps"], foreach=False)
        names = ["sum"]
    else:
        opt = Lion(ps, lr=hp["lr"], betas=hp["betas"], weight_decay=hp.get("weight_decay", 0.0))
        names = ["exp_avg"]
    grads = [[] for _ in sizes]
    traj = {"param": [[] for _ in sizes], "states": [[] for _ in sizes]}
    for step in range(STEPS):
        for i, p in enumerate(ps):
            if probe:
                g = torch.zeros(p.shape, dtype=torch.float32)
                g[step] = 1.0
            else:
                g = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.1
                g[::5] = 0.0  # zeros: Lion's sign(0), Adagrad's eps
            p.grad = g
            grads[i].append(tensor_bits(g))
        opt.step()
        for i, p in enumerate(ps):
            traj["param"][i].append(tensor_bits(p))
            traj["states"][i].append([tensor_bits(opt.state[p][k]) for k in names])
    tensors = []
    for i, n in enumerate(sizes):
        tensors.append({"n": n, "init": init[i], "grads": grads[i], "param": traj["param"][i], "states": traj["states"][i]})
    out = {"name": name, "rule": rule, "state_names": names, "steps": STEPS, "tensors": tensors}
    if probe:
        out["exact"] = True
    if name in FLOAT64_CASES:
        out["lr_f64"], out["lr_decay_f64"] = hp["lr"], hp.get("lr_decay", 0.0)
        hp = given
    for k, v in hp.items():
        if isinstance(v, tuple):
            out["beta1"], out["beta2"] = bits(v[0]), bits(v[1])
        elif isinstance(v, bool):
            out[k] = v
        else:
            out[k] = bits(v)
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "swapper", "optimizer", "testdata", "optimizer_golden.json")
    torch.set_num_threads(1)
    doc = {
        "generator": "scripts/optimizer_golden.py",
        "torch": torch.__version__,
        "note": "float32 values as uint32 bit patterns; per tensor, grads/param/states hold one entry per step; Lion from the paper's formula",
        "cases": [run_case(200 + k, *c) for k, c in enumerate(CASES)],
    }
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
