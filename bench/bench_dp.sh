#!/usr/bin/env bash
# Data parallelism on one machine: train LeNet and ResNet-18 with mgc on one
# device (all cores) and on two replicas (the cores shared out), and with
# PyTorch, in one run, same settings; compare training throughput and report
# the replicas' communication.
#
#   bash bench/bench_dp.sh [--quick] [--nets "lenet resnet18"] [--threads T] [--data DIR]
#
#   --quick                  smoke run: LeNet 512, ResNet-18 256 examples, 1 epoch each
#   --nets LIST              nets to run, of lenet resnet18 (default both)
#   --lenet-epochs E         (default 2)   --lenet-limit-train N  (default: all 60,000)
#   --resnet-epochs E        (default 2)   --resnet-limit-train N (default 2560)
#   --resnet-limit-test N    test examples for ResNet-18 (default 2000; LeNet: all 10,000)
#   --threads T              threads of every run (default nproc): mgc cpu:1 has them all,
#                            cpu:2 shares them out, torch.set_num_threads(T)
#   --sync-bn                pass --sync-bn to the cpu:2 runs (BatchNorm over the global batch)
#   --shard-update           also cpu:2 --shard-update (ZeRO-1), against cpu:1 and cpu:2; peak memory of each
#   --unshared               with --shard-update, also its replicas each with their own parameter blocks
#                            (MGC_SHARED_PARAMS=0: the all-gather copies), against the shared blocks
#   --data DIR               Fashion-MNIST IDX files (default $MGC_DATA, else ../shared/data/fashion-mnist)
#   --batch-size B, --lr X   (default 256, 0.1; the global batch: 128 per replica on cpu:2)
#   --repeat R               mgc's cpu:1 and cpu:2 runs R times each, alternating (default 2)
# Environment: MGC (default ./mgc), PYTHON (default /usr/bin/python3, the one
# with torch), OPENBLAS_CORETYPE (default SkylakeX on AVX-512 CPUs, else Haswell; set for every run).
#
# Throughput is examples/s of the training steps: the per-epoch `examples_per_s`
# of mgc's, torch_lenet.py's and torch_resnet.py's --log JSONL (no start-up, no
# kernel compilation, no test pass), median over epochs; of mgc's R runs per
# device count, made alternately so that both see the machine's slow and fast
# phases alike, the best is kept (as bench_cpu.py does). The target is
# mgc cpu:2 / mgc cpu:1 >= 0.9. The communication report is the kept cpu:2 run's
# `comm` objects: bytes sent per step by the busiest replica against the ring
# allreduce's bound 2(N-1)/N S, and the replicas' mean time waiting for and
# computing between collectives, as shares of the training time (all epochs).
set -euo pipefail

cd "$(dirname "$0")/.."
NETS="lenet resnet18"
LENET_EPOCHS=2
LENET_LIMIT_TRAIN=
LENET_LIMIT_TEST=
RESNET_EPOCHS=2
RESNET_LIMIT_TRAIN=2560
RESNET_LIMIT_TEST=2000
THREADS=$(nproc)
BATCH=256
LR=0.1
REPEAT=2
SYNC_BN=
SHARD=
UNSHARED=
DATA=${MGC_DATA:-$(cd .. && pwd)/shared/data/fashion-mnist}
MGC=${MGC:-./mgc}
PYTHON=${PYTHON:-/usr/bin/python3}
# the newest kernels this CPU runs, as mgc chooses (bench/bench_cpu.py's blas_core)
OPENBLAS_CORETYPE=$(python3 -c 'import sys; sys.path.insert(0, "bench"); from bench_cpu import blas_core; print(blas_core())')
export OPENBLAS_CORETYPE

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) LENET_EPOCHS=1; LENET_LIMIT_TRAIN=512; LENET_LIMIT_TEST=512
                 RESNET_EPOCHS=1; RESNET_LIMIT_TRAIN=256; RESNET_LIMIT_TEST=256; REPEAT=1; shift ;;
        --nets) NETS=$2; shift 2 ;;
        --lenet-epochs) LENET_EPOCHS=$2; shift 2 ;;
        --lenet-limit-train) LENET_LIMIT_TRAIN=$2; shift 2 ;;
        --resnet-epochs) RESNET_EPOCHS=$2; shift 2 ;;
        --resnet-limit-train) RESNET_LIMIT_TRAIN=$2; shift 2 ;;
        --resnet-limit-test) RESNET_LIMIT_TEST=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --sync-bn) SYNC_BN=--sync-bn; shift ;;
        --shard-update) SHARD=1; shift ;;
        --unshared) UNSHARED=1; shift ;;
        --data) DATA=$2; shift 2 ;;
        --batch-size) BATCH=$2; shift 2 ;;
        --lr) LR=$2; shift 2 ;;
        --repeat) REPEAT=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "bench_dp.sh: unknown argument $1" >&2; usage 2 ;;
    esac
done
case "$REPEAT" in
    ''|*[!0-9]*|0) echo "bench_dp.sh: --repeat takes a count of runs, at least 1 (got '$REPEAT')" >&2; exit 2 ;;
esac
if [ -n "$UNSHARED" ] && [ -z "$SHARD" ]; then
    echo "bench_dp.sh: --unshared compares two ways of --shard-update: give --shard-update too" >&2; exit 2
fi
for net in $NETS; do
    case "$net" in
        lenet|resnet18) ;;
        *) echo "bench_dp.sh: unknown net $net (lenet, resnet18)" >&2; exit 2 ;;
    esac
done

if [ ! -x "${MGC%% *}" ]; then
    echo "bench_dp.sh: $MGC not found; building it with make" >&2
    make -s mgc
fi

OUTDIR=$(mktemp -d "${TMPDIR:-/tmp}/bench_dp.XXXXXX")
trap 'rm -rf "$OUTDIR"' EXIT

# now: seconds since the epoch, for wall times
now() { date +%s.%N; }

echo "== data parallelism / Fashion-MNIST: nets $NETS; batch $BATCH, lr $LR, threads $THREADS," \
     "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE, $(nproc) cores"

for net in $NETS; do
    if [ "$net" = lenet ]; then
        file=nets/lenet.net; script=bench/torch_lenet.py
        epochs=$LENET_EPOCHS; ltrain=$LENET_LIMIT_TRAIN; ltest=$LENET_LIMIT_TEST
    else
        file=nets/resnet18.net; script=bench/torch_resnet.py
        epochs=$RESNET_EPOCHS; ltrain=$RESNET_LIMIT_TRAIN; ltest=$RESNET_LIMIT_TEST
    fi
    common=(--epochs "$epochs" --batch-size "$BATCH" --lr "$LR" --threads "$THREADS" --data "$DATA")
    [ -n "$ltrain" ] && common+=(--limit-train "$ltrain")
    [ -n "$ltest" ] && common+=(--limit-test "$ltest")
    printf '{"net": "%s", "file": "%s", "epochs": %s, "limit_train": %s, "limit_test": %s}\n' \
        "$net" "$file" "$epochs" "${ltrain:-null}" "${ltest:-null}" > "$OUTDIR/$net.meta.json"

    for rep in $(seq "$REPEAT"); do
        for devs in 1 2 ${SHARD:+2s} ${UNSHARED:+2u}; do
            extra=() envs=()
            [ "$devs" != 1 ] && [ -n "$SYNC_BN" ] && extra+=("$SYNC_BN")
            [ "$devs" = 2s ] || [ "$devs" = 2u ] && extra+=(--shard-update)
            [ "$devs" = 2u ] && envs=(env MGC_SHARED_PARAMS=0)
            echo "== $net: ${envs[*]:-}${envs[*]:+ }mgc --devices cpu:${devs%[su]} ${extra[*]:-} (run $rep of $REPEAT)"
            t0=$(now)
            ${envs[@]+"${envs[@]}"} $MGC "$file" --devices "cpu:${devs%[su]}" "${common[@]}" ${extra[@]+"${extra[@]}"} \
                --log "$OUTDIR/$net.mgc$devs.$rep.jsonl" 2>&1 | tee "$OUTDIR/$net.mgc$devs.$rep.txt"
            echo "$t0 $(now)" > "$OUTDIR/$net.mgc$devs.$rep.wall"
        done
    done

    echo "== $net: pytorch ($script)"
    t0=$(now)
    "$PYTHON" "$script" "${common[@]}" --log "$OUTDIR/$net.torch.1.jsonl" 2>&1 | tee "$OUTDIR/$net.torch.1.txt"
    echo "$t0 $(now)" > "$OUTDIR/$net.torch.1.wall"
done

# shellcheck disable=SC2086  # $NETS: one argument per net
"$PYTHON" - "$OUTDIR" "$THREADS" "$BATCH" "$LR" "$OPENBLAS_CORETYPE" "$(nproc)" "${SYNC_BN:+1}" $NETS <<'EOF'
import glob, json, os, statistics, sys
outdir, threads, batch, lr, coretype, cores, sync_bn, *nets = sys.argv[1:]
TARGET = 0.9

def read(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]

def wall(stem):
    with open(os.path.join(outdir, stem + ".wall")) as f:
        t0, t1 = map(float, f.read().split())
    return t1 - t0

def run(net, tool):
    """The best of the tool's runs (median examples/s over its epochs) and its
    records; every run's median in "runs"."""
    best, best_recs, runs = None, [], []
    for path in sorted(glob.glob(os.path.join(outdir, f"{net}.{tool}.*.jsonl"))):
        recs = read(path)
        if not recs:
            continue
        eps = [r["examples_per_s"] for r in recs]
        s = {"examples_per_s": statistics.median(eps), "per_epoch": eps,
             "peak_resident_mb": max(r.get("peak_resident_mb", 0) for r in recs),
             "test_acc": recs[-1]["test_acc"], "loss": recs[-1]["loss"],
             "wall_s": wall(os.path.basename(path)[:-len(".jsonl")])}
        runs.append(s["examples_per_s"])
        if best is None or s["examples_per_s"] > best["examples_per_s"]:
            best, best_recs = s, recs
    if best:
        best["runs"] = runs
    return best, best_recs

def comm(recs):
    """The cpu:2 run's communication over all its epochs."""
    cs = [r["comm"] for r in recs if "comm" in r]
    if not cs:
        return None
    steps = sum(c["steps"] for c in cs)
    train_s = sum(r["train_seconds"] for r in recs if "comm" in r)
    sent = sum(c["bytes_per_step"] * c["steps"] for c in cs) / steps
    bound = sum(c["ring_bound_per_step"] * c["steps"] for c in cs) / steps
    wait = sum(c["wait_seconds"] for c in cs)
    compute = sum(c["compute_seconds"] for c in cs)
    return {"steps": steps, "bytes_per_step": sent, "ring_bound_per_step": bound,
            "bytes_vs_bound": sent / bound if bound else None,
            "mpi_bytes_per_step": max(c["mpi_bytes_per_step"] for c in cs),
            "wait_seconds": wait, "compute_seconds": compute, "train_seconds": train_s,
            "wait_share": wait / train_s if train_s else None,
            "compute_share": compute / train_s if train_s else None}

def ratio(a, b):
    return a["examples_per_s"] / b["examples_per_s"] if a and b and b["examples_per_s"] else None

def fmt(x, spec):
    return "-" if x is None else format(x, spec)

results = {}
for net in nets:
    with open(os.path.join(outdir, f"{net}.meta.json")) as f:
        r = json.load(f)
    r["mgc_cpu1"], _ = run(net, "mgc1")
    r["mgc_cpu2"], recs2 = run(net, "mgc2")
    r["mgc_cpu2s"], _ = run(net, "mgc2s")
    r["cpu2s_vs_cpu1"] = ratio(r["mgc_cpu2s"], r["mgc_cpu1"])
    r["mgc_cpu2u"], _ = run(net, "mgc2u")
    r["cpu2u_vs_cpu1"] = ratio(r["mgc_cpu2u"], r["mgc_cpu1"])
    r["pytorch"], _ = run(net, "torch")
    r["cpu2_vs_cpu1"] = ratio(r["mgc_cpu2"], r["mgc_cpu1"])
    r["mgc_cpu1_vs_pytorch"] = ratio(r["mgc_cpu1"], r["pytorch"])
    r["mgc_cpu2_vs_pytorch"] = ratio(r["mgc_cpu2"], r["pytorch"])
    r["comm_cpu2"] = comm(recs2)
    results[net] = r

print(f"== results: training throughput, examples/s (median over epochs, mgc's best of its alternating runs); "
      f"target cpu:2/cpu:1 >= {TARGET}")
print(f"{'net':10s} {'mgc cpu:1':>10s} {'mgc cpu:2':>10s} {'pytorch':>10s} "
      f"{'cpu:2/cpu:1':>14s} {'cpu:1/torch':>12s} {'cpu:2/torch':>12s}")
for net, r in results.items():
    eps = [fmt(r[k]["examples_per_s"] if r[k] else None, ",.0f")
           for k in ("mgc_cpu1", "mgc_cpu2", "pytorch")]
    dp = r["cpu2_vs_cpu1"]
    dps = "-" if dp is None else f"{dp:.2f} " + ("ok" if dp >= TARGET else "LOW")
    print(f"{net:10s} {eps[0]:>10s} {eps[1]:>10s} {eps[2]:>10s} "
          f"{dps:>14s} {fmt(r['mgc_cpu1_vs_pytorch'], '.2f'):>12s} "
          f"{fmt(r['mgc_cpu2_vs_pytorch'], '.2f'):>12s}")
for net, r in results.items():
    if r["mgc_cpu2s"]:
        print(f"{net:10s} cpu:2 --shard-update {r['mgc_cpu2s']['examples_per_s']:,.0f} examples/s, "
              f"{fmt(r['cpu2s_vs_cpu1'], '.2f')} of cpu:1 (target 0.97 ResNet-18, 1.0 LeNet); peak resident "
              f"{r['mgc_cpu1']['peak_resident_mb']:.0f} MB cpu:1, {r['mgc_cpu2']['peak_resident_mb']:.0f} MB cpu:2, "
              f"{r['mgc_cpu2s']['peak_resident_mb']:.0f} MB cpu:2 sharded")
    if r["mgc_cpu2u"]:
        print(f"{net:10s} cpu:2 --shard-update, blocks a replica (MGC_SHARED_PARAMS=0) {r['mgc_cpu2u']['examples_per_s']:,.0f} "
              f"examples/s, {fmt(r['cpu2u_vs_cpu1'], '.2f')} of cpu:1; shared / own blocks "
              f"{fmt(ratio(r['mgc_cpu2s'], r['mgc_cpu2u']), '.3f')}; peak resident {r['mgc_cpu2u']['peak_resident_mb']:.0f} MB "
              f"(runs: " + ", ".join(f"{e:,.0f}" for e in r["mgc_cpu2u"]["runs"]) + "; shared: "
              + ", ".join(f"{e:,.0f}" for e in r["mgc_cpu2s"]["runs"]) + ")")
print("== per run")
for net, r in results.items():
    limit = f"{r['limit_train']:,}" if r["limit_train"] else "all"
    test = f"{r['limit_test']:,}" if r["limit_test"] else "all"
    print(f"{net}: {r['epochs']} epoch(s), {limit} training and {test} test examples")
    for k, name in (("mgc_cpu1", "mgc cpu:1"), ("mgc_cpu2", "mgc cpu:2"), ("pytorch", "pytorch")):
        s = r[k]
        if not s:
            print(f"  {name:10s} no epochs logged")
            continue
        print(f"  {name:10s} {s['examples_per_s']:8,.0f} ex/s (epochs: "
              + ", ".join(f"{e:,.0f}" for e in s["per_epoch"])
              + f")  test_acc {s['test_acc']:.4f}  loss {s['loss']:.4f}  wall {s['wall_s']:.1f} s"
              + (f"  (runs: " + ", ".join(f"{e:,.0f}" for e in s["runs"]) + ")" if len(s["runs"]) > 1 else ""))
print("== communication of the cpu:2 runs (from --log)")
for net, r in results.items():
    c = r["comm_cpu2"]
    if not c:
        print(f"{net:10s} no comm report")
        continue
    print(f"{net:10s} {c['bytes_per_step'] / 1e6:.2f} MB/step sent by the busiest replica, "
          f"ring bound {c['ring_bound_per_step'] / 1e6:.2f} MB ({fmt(c['bytes_vs_bound'], '.2f')}x); "
          f"waiting {100 * c['wait_share']:.1f}%, computing {100 * c['compute_share']:.1f}% "
          f"of {c['train_seconds']:.1f} s training ({c['steps']} steps)")
print("JSON " + json.dumps({"bench": "dp", "cores": int(cores), "threads": int(threads),
                           "batch_size": int(batch), "lr": float(lr),
                           "openblas_coretype": coretype, "sync_bn": bool(sync_bn),
                           "target_cpu2_vs_cpu1": TARGET, "nets": results}))
EOF
