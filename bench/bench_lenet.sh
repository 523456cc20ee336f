#!/usr/bin/env bash
# Train LeNet on Fashion-MNIST with mgc and with PyTorch in one run, same
# settings, and compare training throughput and test accuracy.
#
#   bash bench/bench_lenet.sh [--epochs E] [--threads T] [--data DIR]
#
#   --epochs E    epochs for both (default 2)
#   --threads T   threads for both: mgc --threads, torch.set_num_threads (default nproc)
#   --data DIR    Fashion-MNIST IDX files (default $MGC_DATA, else ../shared/data/fashion-mnist)
#   --batch-size B, --lr X   (default 256, 0.1)
# Environment: MGC (default ./mgc), PYTHON (default /usr/bin/python3, the one
# with torch), OPENBLAS_CORETYPE (default SkylakeX on AVX-512 CPUs, else Haswell; set for both runs).
#
# Throughput is examples/s of the training steps: mgc's and torch_lenet.py's
# per-epoch `examples_per_s` from their --log JSONL (no start-up, no test pass),
# median over epochs. Test accuracy is the last epoch's.
set -euo pipefail

cd "$(dirname "$0")/.."
EPOCHS=2
THREADS=$(nproc)
BATCH=256
LR=0.1
DATA=${MGC_DATA:-$(cd .. && pwd)/shared/data/fashion-mnist}
MGC=${MGC:-./mgc}
PYTHON=${PYTHON:-/usr/bin/python3}
# the newest kernels this CPU runs, as mgc chooses (bench/bench_cpu.py's blas_core)
OPENBLAS_CORETYPE=$(python3 -c 'import sys; sys.path.insert(0, "bench"); from bench_cpu import blas_core; print(blas_core())')
export OPENBLAS_CORETYPE

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
    case "$1" in
        --epochs) EPOCHS=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --data) DATA=$2; shift 2 ;;
        --batch-size) BATCH=$2; shift 2 ;;
        --lr) LR=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "bench_lenet.sh: unknown argument $1" >&2; usage 2 ;;
    esac
done

if [ ! -x "${MGC%% *}" ]; then
    echo "bench_lenet.sh: $MGC not found; building it with make" >&2
    make -s mgc
fi

OUTDIR=$(mktemp -d "${TMPDIR:-/tmp}/bench_lenet.XXXXXX")
trap 'rm -rf "$OUTDIR"' EXIT

echo "== LeNet / Fashion-MNIST: epochs $EPOCHS, batch $BATCH, lr $LR, threads $THREADS," \
     "OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE, $(nproc) cores"

echo "== mgc"
t0=$(date +%s.%N)
$MGC nets/lenet.net --epochs "$EPOCHS" --batch-size "$BATCH" --lr "$LR" --threads "$THREADS" \
    --data "$DATA" --log "$OUTDIR/mgc.jsonl" 2>&1 | tee "$OUTDIR/mgc.txt"
t1=$(date +%s.%N)

echo "== pytorch"
"$PYTHON" bench/torch_lenet.py --epochs "$EPOCHS" --batch-size "$BATCH" --lr "$LR" \
    --threads "$THREADS" --data "$DATA" --log "$OUTDIR/torch.jsonl" 2>&1 | tee "$OUTDIR/torch.txt"
t2=$(date +%s.%N)

"$PYTHON" - "$OUTDIR/mgc.jsonl" "$OUTDIR/torch.jsonl" "$t0" "$t1" "$t2" "$THREADS" "$EPOCHS" <<'EOF'
import json, statistics, sys
mgc_log, torch_log, t0, t1, t2, threads, epochs = sys.argv[1:]
def read(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]
def summary(name, recs, wall):
    if not recs:
        print(f"{name}: no epochs logged")
        return None
    eps = [r["examples_per_s"] for r in recs]
    s = {"examples_per_s": statistics.median(eps), "per_epoch": eps,
         "test_acc": recs[-1]["test_acc"], "loss": recs[-1]["loss"], "wall_s": wall}
    print(f"{name:8s} {s['examples_per_s']:10.0f} ex/s (median of {len(eps)} epochs: "
          + ", ".join(f"{e:.0f}" for e in eps) + f")  test_acc {s['test_acc']:.4f}  "
          f"loss {s['loss']:.4f}  wall {wall:.1f} s")
    return s
print("== results (training throughput, examples/s)")
m = summary("mgc", read(mgc_log), float(t1) - float(t0))
p = summary("pytorch", read(torch_log), float(t2) - float(t1))
ratio = m["examples_per_s"] / p["examples_per_s"] if m and p else None
if ratio is not None:
    print(f"ratio mgc/pytorch {ratio:.2f}x")
print("JSON " + json.dumps({"bench": "lenet", "threads": int(threads), "epochs": int(epochs),
                           "mgc": m, "pytorch": p, "ratio": ratio}))
EOF
