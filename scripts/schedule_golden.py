#!/usr/bin/python3
"""Write golden learning-rate schedules for zinf's schedule package.

For each case, a DeepSpeed "scheduler" section (and optimizer lr) and, per
applied optimizer step k = 1..K:

  torch_lr, torch_beta1: the value from the torch.optim.lr_scheduler class
      that has the same shape, where one exists, evaluated in its closed
      form (or CyclicLR's get_lr, which is closed-form) at the matching
      epoch; null where torch has no equivalent (log warmup, OneCycle's
      stairs and post-cycle decay, the constructor values of step 1);
  formula_lr, formula_beta1: DeepSpeed's formula evaluated in Python
      doubles (written out here from DeepSpeed's lr_schedules.py).

The Go test TestSchedulesMatchGolden compares zinf's schedules with both.
DeepSpeed builds its scheduler at last_batch_iteration -1 and steps it
after each applied optimizer step, so step k runs at iteration it = k-2
(step 1 gets the constructor's value).

Mappings to torch (closed forms; all at base lr as below):
  WarmupLR linear (min > 0):    LinearLR(start_factor=min/max, end_factor=1,
                                total_iters=W) on base max, epoch it.
  WarmupDecayLR linear (min>0): the same warmup; then DeepSpeed's
                                min + (max-min)*g with g from LinearLR(1 -> 0,
                                total_iters=T-W) on base 1.0 at epoch it-W.
  WarmupCosineLR linear:        LinearLR(start_factor=wmin, end_factor=1,
                                total_iters=W) on base lr, epoch it; then
                                CosineAnnealingLR(T_max=T-W,
                                eta_min=lr*cmin) at epoch min(it-W+1, T-W).
  OneCycle (cycle part):        CyclicLR(triangular, step_size_up=first,
                                step_size_down=second, base/max momentum:
                                the momentum is DeepSpeed's beta1) at epoch it+1.

Usage: /usr/bin/python3 scripts/schedule_golden.py [output path]
(Debian: apt-get install python3-torch)
"""

import json
import math
import os
import sys

import torch
from torch.optim import lr_scheduler as S


def warm_gamma(it, W, typ):
    if typ == "log":
        return (1.0 / math.log(W)) * math.log(it + 1)
    return it / W


def ds_warmup_lr(p, opt_lr, it):
    mn = p.get("warmup_min_lr", 0.0)
    mx = p.get("warmup_max_lr", opt_lr)
    W = max(2, p.get("warmup_num_steps", 1000))
    typ = p.get("warmup_type", "log")
    if it < 0:
        return mn
    g = warm_gamma(it, W, typ) if it < W else 1.0
    return mn + (mx - mn) * g


def ds_warmup_decay_lr(p, opt_lr, it):
    mn = p.get("warmup_min_lr", 0.0)
    mx = p.get("warmup_max_lr", 0.001)
    W = max(2, p.get("warmup_num_steps", 1000))
    T = p["total_num_steps"]
    typ = p.get("warmup_type", "log")
    if it < 0:
        return mn
    if it < W:
        g = warm_gamma(it, W, typ)
    else:
        g = max(0.0, float(T - it) / float(max(1.0, T - W)))
    return mn + (mx - mn) * g


def ds_warmup_cosine_lr(p, opt_lr, it):
    W = max(2, p.get("warmup_num_steps", 1000))
    T = p["total_num_steps"]
    wmin = p.get("warmup_min_ratio", 0.0)
    cmin = p.get("cos_min_ratio", 0.0001)
    typ = p.get("warmup_type", "log")
    if it < 0:
        return 0.0
    if it < W:
        r = warm_gamma(it, W, typ)
        r = wmin + r * (1.0 - wmin)
    else:
        prog = min(1.0, (it - W + 1) / max(1, T - W))
        r = (1 + math.cos(math.pi * prog)) / 2
        r = max(0.0, cmin + (1.0 - cmin) * r)
    return opt_lr * r


def ds_one_cycle(p, opt_lr, it):
    """(lr, beta1 or None)."""
    mn, mx = p["cycle_min_lr"], p["cycle_max_lr"]
    first = float(p.get("cycle_first_step_size", 2000))
    second = float(p.get("cycle_second_step_size", first))
    fs = p.get("cycle_first_stair_count", 0)
    ss = p.get("cycle_second_stair_count", fs)
    dss = p.get("decay_step_size", 0)
    dlr = p.get("decay_lr_rate", 0.0)
    mom = p.get("cycle_momentum", True)
    mmin, mmax = p.get("cycle_min_mom", 0.8), p.get("cycle_max_mom", 0.9)
    dmom = p.get("decay_mom_rate", 0.0)
    total = first + second
    ratio = first / total
    if it < 0:
        return mn, (mmin if mom else None)
    if it < total:
        bi = it + 1
        cycle = math.floor(1 + bi / total)
        x = 1. + bi / total - cycle
        if x <= ratio:
            sf, stairs = x / ratio, fs
        else:
            sf, stairs = (x - 1) / (ratio - 1), ss
        if stairs > 0:
            ci = bi % total
            if ci <= first:
                pos = ci * stairs / first
            else:
                pos = (total - ci) * stairs / second
            sf = math.floor(pos) / stairs
        lr = mn + (mx - mn) * sf
        return lr, ((mmax - (mmax - mmin) * sf) if mom else None)
    dbi = it - total + 1
    lr = mn
    if dss != 0 and dlr != 0:
        lr = mn / (1 + dlr * (dbi / dss))
    b1 = None
    if mom:
        b1 = mmax
        if dss != 0 and dmom != 0:
            b1 = mmax * (1 + dmom * (dbi / dss))
    return lr, b1


def closed(sched, epoch):
    sched.last_epoch = epoch
    return sched._get_closed_form_lr()[0]


def opt(lr, momentum=False):
    w = torch.nn.Parameter(torch.zeros(1))
    if momentum:
        # torch 1.13's CyclicLR cycles "momentum" only (not Adam's betas);
        # its momentum is the value DeepSpeed's OneCycle writes as beta1.
        return torch.optim.SGD([w], lr=lr, momentum=0.9)
    return torch.optim.SGD([w], lr=lr)


def torch_values(kind, p, opt_lr, K):
    """Per step k = 1..K: (lr or None, beta1 or None)."""
    out = []
    if kind == "WarmupLR" and p.get("warmup_type") == "linear" and p.get("warmup_min_lr", 0) > 0:
        mn, mx, W = p["warmup_min_lr"], p["warmup_max_lr"], max(2, p["warmup_num_steps"])
        s = S.LinearLR(opt(mx), start_factor=mn / mx, end_factor=1.0, total_iters=W)
        for k in range(1, K + 1):
            out.append((closed(s, max(k - 2, 0)), None))
        return out
    if kind == "WarmupDecayLR" and p.get("warmup_type") == "linear" and p.get("warmup_min_lr", 0) > 0:
        mn, mx, W, T = p["warmup_min_lr"], p["warmup_max_lr"], max(2, p["warmup_num_steps"]), p["total_num_steps"]
        up = S.LinearLR(opt(mx), start_factor=mn / mx, end_factor=1.0, total_iters=W)
        down = S.LinearLR(opt(1.0), start_factor=1.0, end_factor=0.0, total_iters=T - W)
        for k in range(1, K + 1):
            it = max(k - 2, 0)
            if it < W:
                out.append((closed(up, it), None))
            else:
                out.append((mn + (mx - mn) * closed(down, it - W), None))
        return out
    if kind == "WarmupCosineLR" and p.get("warmup_type") == "linear" and p.get("warmup_min_ratio", 0) > 0:
        W, T = max(2, p["warmup_num_steps"]), p["total_num_steps"]
        wmin, cmin = p["warmup_min_ratio"], p.get("cos_min_ratio", 0.0001)
        up = S.LinearLR(opt(opt_lr), start_factor=wmin, end_factor=1.0, total_iters=W)
        cos = S.CosineAnnealingLR(opt(opt_lr), T_max=T - W, eta_min=opt_lr * cmin)
        out.append((None, None))  # step 1: DeepSpeed's constructor sets 0
        for k in range(2, K + 1):
            it = k - 2
            if it < W:
                out.append((closed(up, it), None))
            else:
                out.append((closed(cos, min(it - W + 1, T - W)), None))
        return out
    if kind == "OneCycle" and p.get("cycle_first_stair_count", 0) == 0:
        mn, mx = p["cycle_min_lr"], p["cycle_max_lr"]
        first = p.get("cycle_first_step_size", 2000)
        second = p.get("cycle_second_step_size", first)
        mom = p.get("cycle_momentum", True)
        o = opt(mn, momentum=True)
        s = S.CyclicLR(o, base_lr=mn, max_lr=mx, step_size_up=first, step_size_down=second, mode="triangular",
                       cycle_momentum=mom, base_momentum=p.get("cycle_min_mom", 0.8), max_momentum=p.get("cycle_max_mom", 0.9))
        total = first + second
        for k in range(1, K + 1):
            it = k - 2
            if it >= total:
                out.append((None, None))  # post-cycle decay: no torch equivalent
                continue
            s.last_epoch = it + 1
            lr = s.get_lr()[0]
            b1 = o.param_groups[0]["momentum"] if mom and k > 1 else None
            out.append((lr, b1))
        return out
    return [(None, None)] * K


CASES = [
    ("warmup_linear", "WarmupLR", {"warmup_min_lr": 1e-4, "warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "linear"}, 1e-3, 25),
    ("warmup_log", "WarmupLR", {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3, "warmup_num_steps": 7, "warmup_type": "log"}, 1e-3, 20),
    ("warmup_default_max", "WarmupLR", {"warmup_num_steps": 1, "warmup_type": "linear"}, 2e-2, 6),
    ("warmup_decay_linear", "WarmupDecayLR", {"warmup_min_lr": 2e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 6, "warmup_type": "linear", "total_num_steps": 30}, 1e-3, 36),
    ("warmup_decay_log", "WarmupDecayLR", {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 5, "total_num_steps": 12}, 1e-3, 16),
    ("warmup_cosine_linear", "WarmupCosineLR", {"warmup_min_ratio": 0.1, "warmup_num_steps": 5, "warmup_type": "linear", "total_num_steps": 25, "cos_min_ratio": 0.05}, 1e-2, 32),
    ("warmup_cosine_log", "WarmupCosineLR", {"warmup_num_steps": 4, "total_num_steps": 10}, 3e-3, 14),
    ("one_cycle", "OneCycle", {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2, "cycle_first_step_size": 4, "cycle_second_step_size": 6,
                               "decay_step_size": 2, "decay_lr_rate": 0.5, "decay_mom_rate": 0.1}, 1e-3, 20),
    ("one_cycle_no_momentum", "OneCycle", {"cycle_min_lr": 2e-4, "cycle_max_lr": 3e-3, "cycle_first_step_size": 3, "cycle_momentum": False}, 1e-3, 12),
    ("one_cycle_stairs", "OneCycle", {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2, "cycle_first_step_size": 6, "cycle_second_step_size": 4,
                                      "cycle_first_stair_count": 3, "cycle_second_stair_count": 2, "decay_step_size": 3, "decay_lr_rate": 0.2}, 1e-3, 18),
]

FORMULAS = {
    "WarmupLR": lambda p, lr, it: (ds_warmup_lr(p, lr, it), None),
    "WarmupDecayLR": lambda p, lr, it: (ds_warmup_decay_lr(p, lr, it), None),
    "WarmupCosineLR": lambda p, lr, it: (ds_warmup_cosine_lr(p, lr, it), None),
    "OneCycle": ds_one_cycle,
}


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "schedule", "testdata", "schedule_golden.json")
    cases = []
    for name, kind, params, opt_lr, K in CASES:
        tv = torch_values(kind, params, opt_lr, K)
        steps = []
        for k in range(1, K + 1):
            lr, b1 = FORMULAS[kind](params, opt_lr, k - 2)
            steps.append({"k": k, "formula_lr": lr, "formula_beta1": b1, "torch_lr": tv[k - 1][0], "torch_beta1": tv[k - 1][1]})
        cases.append({"name": name, "scheduler": {"type": kind, "params": params}, "optimizer_lr": opt_lr, "steps": steps})
    doc = {"generator": "scripts/schedule_golden.py", "torch": torch.__version__,
           "note": "learning rates per applied step k; torch_* from torch.optim.lr_scheduler where it has the same shape (null elsewhere), formula_* DeepSpeed's formulas in Python doubles",
           "cases": cases}
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {out} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
