#!/usr/bin/python3
"""The cost model against the GPU: predicted and measured time per kernel kind.

    python3 tests/gpu/cost_vs_measured.py PROFILE COST

PROFILE: mgc's per-step profile of a run on one GPU (MGC_PROFILE=1, its
stderr: "  step  node  share  ms/run  what"); COST: `mgc NET --emit kernels
--devices cuda:0` of the same net and batch (the cost model's table, "  step
K  NAME ... fp32 us  bf16 us  mgc us  bound"). Steps are joined by their index (the
same program: same net, batch, devices and MGC_* settings) and summed by kind
(a kernel's name past "k12_"; GEMMs as "gemm"). Measured times are
synchronised after every step (MGC_PROFILE), so each carries a launch and a
synchronisation the model's graph replay would not: the ratio of the large
kinds is the model's error, the small ones' mostly that overhead.
"""
import re
import sys


def profile(path):
    """step index -> (what, ms per run)"""
    steps = {}
    for line in open(path):
        m = re.match(r"\s+(\d+)\s+%(\d+)\s+[\d.]+%\s+([\d.]+)\s+(\S+)", line)
        if m:
            steps[int(m.group(1))] = (m.group(4), float(m.group(3)))
    return steps


def cost(path):
    """step index -> (name, predicted fp32 us), from the cost model's table"""
    steps, header = {}, None
    for line in open(path):
        if "cost model:" in line:
            header = line.strip()
        m = re.match(r"\s+step (\d+)\s+(\S+)(?: (\S+))?.*\s([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(memory|compute|launch|link)\s*$", line)
        if m and header:
            name = "gemm" if m.group(2) == "gemm" else m.group(2)
            steps[int(m.group(1))] = (name, float(m.group(4)))
    return header, steps


def kind(name):
    return "gemm" if name == "gemm" else re.sub(r"^k\d+_", "", name)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    measured = profile(sys.argv[1])
    header, predicted = cost(sys.argv[2])
    if not measured or not predicted:
        sys.exit(f"cost_vs_measured: no steps in {sys.argv[1] if not measured else sys.argv[2]}")
    kinds = {}
    unmatched = 0
    for k, (name, us) in predicted.items():
        if k not in measured or kind(measured[k][0]) != kind(name):
            unmatched += 1
            continue
        e = kinds.setdefault(kind(name), [0, 0.0, 0.0])
        e[0] += 1
        e[1] += us
        e[2] += measured[k][1] * 1e3
    print(header or "")
    print(f"{'kind':30} {'steps':>5} {'predicted us':>13} {'measured us':>12} {'measured/predicted':>19}")
    tp = tm = 0.0
    for name, (n, p, m) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
        tp, tm = tp + p, tm + m
        print(f"{name:30} {n:5} {p:13.1f} {m:12.1f} {m / p if p > 0 else float('nan'):19.2f}")
    print(f"{'all':30} {sum(e[0] for e in kinds.values()):5} {tp:13.1f} {tm:12.1f} {tm / tp if tp > 0 else float('nan'):19.2f}")
    if unmatched:
        print(f"({unmatched} predicted steps had no measured step of the same kind: not the same program?)")


if __name__ == "__main__":
    main()
