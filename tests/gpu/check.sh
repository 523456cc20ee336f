#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and its driver (the project's
# CI has none). Under five minutes on one H200:
#   1. builds mgc with CUDA (MPI off), from .gpu/ where the machine lacks
#      flex, bison, OpenBLAS or zlib's headers (bash tests/gpu/prepare.sh
#      makes .gpu/ on a machine that has them; carry it);
#   2. every op's forward and backward on cuda:0 against PyTorch, through the
#      same reference suite the CPU backend passes (tests/torch/ref.py);
#   3. the GPU against the CPU backend on whole nets, in check mode: LeNet
#      and ResNet-18 on cuda:0 = cpu, and two replicas on one GPU
#      (cuda:0,cuda:0) = cpu:2, --sync-bn included;
#   4. one epoch of LeNet and of ResNet-18 on cuda:0 and on cuda:0,cuda:0,
#      and PyTorch on the same GPU, nets and batch;
# and prints one table: examples/s, seconds per epoch, test accuracy, ratio to
# PyTorch; and the cost model's predicted time per kernel kind against the
# measured (cost_vs_measured.txt). Everything goes to $OUT (default /tmp/mgc-gpu):
# check.log, table.txt, profile.txt (mgc's per-step profile of ResNet-18 on the
# GPU), cost.txt (the model's table for the same program).
#   bash tests/gpu/check.sh
#   bash tests/gpu/check.sh --phase check,ref   # some phases only: build (always),
#        check (check mode, ~1-2 min), ref (every op, ~2-3 min), lenet and resnet
#        (an epoch on each device list, and PyTorch); default all. A device session
#        gives at most 600 s a command: run them as two or three commands, e.g.
#        --phase check,lenet then --phase resnet then --phase ref. CI already
#        runs check and ref on emulated GPUs (tests/fakecuda.sh): on a real one
#        what they add is the GPU's own arithmetic and concurrency, and what only
#        a GPU can give is the speed (lenet, resnet): run those first
#   bash tests/gpu/check.sh --dry-run   # here, without a GPU: the same script with
#                                       # cpu for cuda:0, cpu:2 for cuda:0,cuda:0, PyTorch
#                                       # on the CPU, short epochs and no build (./mgc as
#                                       # it is), so that its own bugs show before a GPU
#                                       # session's few minutes are spent on them
#   bash tests/gpu/check.sh --fake      # here, on the GPUs of tests/fakecuda (the driver,
#                                       # NVRTC, cuBLAS and NCCL on the CPU; tests/fakecuda.sh
#                                       # sets them up): cuda devices as written, no build,
#                                       # PyTorch on the CPU, short epochs
# Where the machine has two GPUs or more, the check phase adds two replicas on
# two GPUs (NCCL) against cpu:2. REF_SKIP: more --skip patterns for ref.py
# (space-separated). The CNN zoo's cases (zoo_*: nine nets, NVRTC compiling
# hundreds of kernels each) are left out unless REF_ZOO=1: they would take
# most of a session's device minutes.
set -u
DRY=0 FAKE=0 PHASES=check,ref,lenet,resnet
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) DRY=1 ;;
        --fake) FAKE=1 ;;
        --phase) PHASES=${2:-}; shift ;;
        --phase=*) PHASES=${1#--phase=} ;;
        *) echo "check.sh: unknown argument '$1' (--dry-run, --fake, --phase build,check,ref,lenet,resnet)"; exit 2 ;;
    esac
    shift
done
for p in ${PHASES//,/ }; do
    case $p in build|check|ref|lenet|resnet) ;; *) echo "check.sh: unknown phase '$p' (build, check, ref, lenet, resnet)"; exit 2 ;; esac
done
phase() { [[ ,$PHASES, == *,$1,* ]]; }
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp/mgc-gpu}
mkdir -p "$R"
exec > >(tee "$R/check.log") 2>&1
T0=$SECONDS
PY=${PY:-python3}
DATA=${MGC_DATA:-}
[ -z "$DATA" ] && for d in .gpu/data ../shared/data/fashion-mnist; do [ -f "$d/train-images-idx3-ubyte.gz" ] && DATA=$d && break; done
export MGC_DATA=$DATA
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/mgc-gpu-cache}
# dev LIST: the devices to ask for (the dry run's CPU stand-ins); TORCH_DEV; EPOCH: options that shorten an epoch
dev() { if [ $DRY = 1 ]; then case $1 in cuda:0) echo cpu ;; cuda:0,cuda:0) echo cpu:2 ;; *) echo "$1" ;; esac; else echo "$1"; fi; }
TORCH_DEV=cuda EPOCH=""
[ $DRY = 1 ] && TORCH_DEV=cpu EPOCH="--limit-train 2560 --limit-test 1000" && echo "dry run: CPU devices stand in for the GPU"
[ $FAKE = 1 ] && TORCH_DEV=cpu EPOCH="--limit-train 2560 --limit-test 1000" && echo "fake GPUs: tests/fakecuda runs the CUDA path on the CPU"
step() { echo; echo "== $* ($((SECONDS - T0)) s)"; }
fails=0
failed() { fails=$((fails + 1)); echo "FAIL $*"; }

step "the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2> /dev/null || echo "nvidia-smi: none"
command -v nvcc > /dev/null && nvcc --version | tail -1
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tail -1

step "build"
if [ $DRY = 1 ] || [ $FAKE = 1 ]; then echo "no build: ./mgc as it is"; else
# flex/bison missing: the carried generated parser and lexer, newer than their sources
if ! command -v bison > /dev/null || ! command -v flex > /dev/null; then
    mkdir -p build && cp .gpu/gen/* build/ && touch build/parser.tab.h build/parser.tab.c && sleep 1 && touch build/lexer.c
fi
EXTRA_C="" EXTRA_L=""
if [ -n "${MGC_SYSROOT:-}" ] || ! printf '#include <cblas.h>\n#include <zlib.h>\nint main(void) { return 0; }\n' |
        cc -x c -o /dev/null - -lopenblas -lz > /dev/null 2>&1; then
    SYS=/tmp/mgc-sysroot
    mkdir -p $SYS
    for f in .gpu/debs/*.deb; do dpkg -x "$f" $SYS; done
    OB=$SYS/usr/lib/x86_64-linux-gnu/openblas-pthread
    ln -sf libopenblas.so.0 $OB/libopenblas.so 2> /dev/null
    [ -e $SYS/usr/lib/x86_64-linux-gnu/libz.so ] || ln -sf "$(ls /lib/x86_64-linux-gnu/libz.so.1 /usr/lib/x86_64-linux-gnu/libz.so.1 2> /dev/null | head -1)" $SYS/usr/lib/x86_64-linux-gnu/libz.so
    EXTRA_C="-I$SYS/usr/include -I$SYS/usr/include/x86_64-linux-gnu/openblas-pthread"
    EXTRA_L="-L$OB -L$SYS/usr/lib/x86_64-linux-gnu -Wl,-rpath,$OB -Wl,-rpath,$SYS/usr/lib/x86_64-linux-gnu"
    export LD_LIBRARY_PATH=$OB:$SYS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "OpenBLAS and zlib headers from .gpu/debs (unpacked in $SYS)"
fi
make -j"$(nproc)" MPI=0 CFLAGS="-O2 -g $EXTRA_C" LDFLAGS="$EXTRA_L" > "$R/build.log" 2>&1
rc=$?
grep -E "error|warning|^mgc:|^     " "$R/build.log"
[ $rc = 0 ] && [ -x ./mgc ] || { tail -20 "$R/build.log"; echo "FAIL build (make exit $rc; $R/build.log)"; exit 1; }
# NCCL: the toolkit's, else PyTorch's wheel's
if [ -z "${MGC_NCCL:-}" ] && ! ldconfig -p | grep -q libnccl.so.2 && [ ! -f /usr/local/cuda/lib64/libnccl.so.2 ]; then
    n=$($PY -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2> /dev/null)
    [ -n "$n" ] && [ -f "$n" ] && export MGC_NCCL=$n && echo "NCCL: $n"
fi
if ! ./mgc nets/lenet.net --gpus 1 --epochs 0 > "$R/probe" 2>&1; then
    cat "$R/probe"; echo "FAIL: mgc sees no GPU here"; exit 1
fi
fi

if phase check; then
step "the GPU against the CPU backend, check mode"
# a run that fails with CUDA graphs runs again without them, to tell the two apart
GPUS=$(./mgc --version 2> /dev/null | grep -cE ' cuda:[0-9]+, ')
$PY - "$R" $DRY "$GPUS" <<'EOF' || fails=$((fails + 1))
import os, subprocess, sys, torch
sys.path.insert(0, "tests")
import st
R = sys.argv[1]
def dev(d):   # the dry run's CPU stand-ins
    return {"cuda:0": "cpu", "cuda:0,cuda:0": "cpu:2"}.get(d, d) if sys.argv[2] == "1" else d
def mgc(*a, env={}):
    run = lambda more: subprocess.run(["./mgc"] + [str(x) for x in a], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      timeout=100, env=dict(os.environ, **env, **more))
    p = run({})
    if p.returncode:
        q = run({"MGC_CUDA_GRAPHS": "0", "CUDA_LAUNCH_BLOCKING": "1"})
        raise SystemExit(f"FAIL mgc {' '.join(map(str, a))}:\n{p.stdout.decode()[-800:]}\n"
                         f"-- again with MGC_CUDA_GRAPHS=0 CUDA_LAUNCH_BLOCKING=1: exit {q.returncode}\n{q.stdout.decode()[-800:]}")
bad = 0
# a device list ending in " nographs" runs with MGC_CUDA_GRAPHS=0: three steps are one
# run as issued, one recorded into a CUDA graph, one replayed
cases = [("nets/lenet.net", 64, 3, [], "cuda:0", "cpu", 1e-4),
         ("nets/lenet.net", 64, 3, [], "cuda:0", "cuda:0 nographs", 1e-6),
         # ResNet-18: what step 1 computes (logits, gradients, both losses, running statistics) to 1e-4;
         # the parameters after step 2 (and the evaluation logits of them) to 2e-2: step 1's parameters
         # agree to 3e-6, but step 2's gradients of the first layers are ill-conditioned (ReLU and max-pool
         # decisions near ties flip): float64 PyTorch from the CPU's step-1 parameters lands 6.5e-3 from
         # float64 PyTorch's own second step on stage1.0.bn1.bias (measured 2026-12-05)
         ("nets/resnet18.net", 32, 2, [], "cuda:0", "cpu", {"default": 1e-4, "after": 2e-2}),
         ("nets/lenet.net", 64, 3, [], "cuda:0,cuda:0", "cpu:2", 1e-4),
         ("tests/nets/small_resnet.net", 6, 2, ["--sync-bn"], "cuda:0,cuda:0", "cpu:2", 1e-4),
         ("tests/nets/small_resnet.net", 6, 2, ["--sync-bn"], "cuda:0,cuda:0", "cuda:0", 1e-4)]
if int(sys.argv[3]) >= 2 and sys.argv[2] != "1":   # two GPUs: NCCL
    cases += [("nets/lenet.net", 64, 3, [], "cuda:0,cuda:1", "cpu:2", 1e-4),
              ("tests/nets/small_resnet.net", 6, 3, ["--sync-bn"], "cuda:0,cuda:1", "cpu:2", 1e-4)]
for net, b, steps, extra, dev_a, dev_b, tol in cases:
    g = torch.Generator().manual_seed(1)
    shape = (1, 12, 12) if "small" in net else (1, 28, 28)
    x, y = torch.randn((b,) + shape, generator=g), torch.randint(0, 10, (b,), generator=g)
    st.save({"x": x, "y": y}, f"{R}/batch.st")
    mgc(net, "--epochs", 0, "--batch-size", b, *extra, "--save", f"{R}/init.st")
    for d, out in ((dev_a, "a"), (dev_b, "b")):
        mgc(net, "--devices", dev(d.split()[0]), "--batch-size", b, *extra, "--load", f"{R}/init.st", "--check-batch", f"{R}/batch.st",
            "--steps", steps, "--lr", 0.01, "--dump", f"{R}/{out}.st", env={"MGC_CUDA_GRAPHS": "0"} if "nographs" in d else {})
    A, B = st.load(f"{R}/a.st"), st.load(f"{R}/b.st")
    worst, name, ratio, ok = 0.0, "", -1.0, True
    for k in B:
        if k.startswith("replicas."): continue
        e = float((A[k].double() - B[k].double()).norm()) / max(float(B[k].double().norm()), 1e-6)
        after = k == "eval_logits" or not (k.startswith("grad.") or k in ("logits", "loss") or "running" in k)
        t = tol if not isinstance(tol, dict) else tol["after" if after else "default"]
        ok &= e <= t
        if e / t > ratio: worst, name, ratio = e, k, e / t   # the closest to its tolerance
    tol = f"{tol:g}" if not isinstance(tol, dict) else f"{tol['default']:g}, {tol['after']:g} after the last step"
    bad += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {net} {' '.join(extra)}: {dev_a} against {dev_b}, {steps} steps of {b}: "
          f"worst relative difference {worst:.1e} ({name}), tolerance {tol}")
sys.exit(bad > 0)
EOF
fi

if phase ref; then
step "every op on cuda:0 against PyTorch (tests/torch/ref.py)"
# the cases shared out between J processes (every J-th case each), side by side on the GPU
J=$(( $(nproc) / 2 )); [ $J -gt 8 ] && J=8; [ $J -lt 1 ] && J=1
skips=()
read -ra pats <<< "${REF_SKIP:-} $([ "${REF_ZOO:-0}" = 1 ] || echo 'zoo_*')"
for p in "${pats[@]}"; do skips+=(--skip "$p"); done
pids=()
for k in $(seq 0 $((J - 1))); do
    # then the op nets in --precision bf16 (cuBLAS's bf16 tensor cores) against autocast and the emulated policy
    ( MGC="./mgc --devices $(dev cuda:0)" REF_OUT="$R/ref-work/$k" REF_MGC_TIMEOUT=100 timeout "${REF_TIMEOUT:-150}" $PY tests/torch/ref.py --skip 'dp_*' "${skips[@]}" --shard $k/$J \
          > "$R/ref.$k.txt" 2>&1 &&
      MGC="./mgc --devices $(dev cuda:0)" REF_OUT="$R/ref-work/bf16-$k" REF_MGC_TIMEOUT=100 timeout "${REF_TIMEOUT:-150}" $PY tests/torch/ref.py --precision bf16 \
          --only 'op_*' --skip '*_nesterov3' --skip '*_adamw4' --shard $k/$J >> "$R/ref.$k.txt" 2>&1; echo $? > "$R/ref.$k.rc" ) &
    pids+=($!)
done
wait "${pids[@]}"
cat "$R"/ref.*.txt > "$R/ref.txt"
grep -E "^FAIL" "$R/ref.txt" | head -20
awk '/^[0-9]+ passed, [0-9]+ failed/ {p += $1; f += $3} END {print p " passed, " f " failed (" FILENAME ")"}' "$R/ref.txt"
for k in $(seq 0 $((J - 1))); do
    rc=$(cat "$R/ref.$k.rc" 2> /dev/null || echo none)
    [ "$rc" = 0 ] || failed "ref.py --shard $k/$J on $(dev cuda:0) (exit $rc$([ "$rc" = 124 ] && echo ': timed out'))"
done
fi

for net in lenet resnet18; do
    phase ${net%18} || continue
    step "one epoch of $net on each device list, and PyTorch on the same GPU"
    for devs in cuda:0 cuda:0,cuda:0; do
        # shellcheck disable=SC2086
        timeout 120 ./mgc nets/$net.net --devices "$(dev $devs)" --epochs 1 $EPOCH --log "$R/$net-$devs.jsonl" > "$R/run.txt" 2>&1 ||
            { failed "mgc $net on $devs"; tail -5 "$R/run.txt"; }
        tail -2 "$R/run.txt"
    done
    # shellcheck disable=SC2086
    timeout 120 ./mgc nets/$net.net --devices "$(dev cuda:0)" --precision bf16 --epochs 1 $EPOCH --log "$R/$net-cuda:0-bf16.jsonl" > "$R/run.txt" 2>&1 ||
        { failed "mgc $net on cuda:0 in bf16"; tail -5 "$R/run.txt"; }
    tail -2 "$R/run.txt"
    script=bench/torch_lenet.py
    [ $net = resnet18 ] && script=bench/torch_resnet.py
    for ac in off bf16; do
        # shellcheck disable=SC2086
        timeout 120 $PY $script --device $TORCH_DEV --epochs 1 $EPOCH --autocast $ac --data "$DATA" \
            --log "$R/$net-torch$([ $ac = bf16 ] && echo -bf16).jsonl" > "$R/run.txt" 2>&1 ||
            { failed "PyTorch $net (autocast $ac)"; tail -5 "$R/run.txt"; }
        tail -2 "$R/run.txt"
    done
done
phase resnet && MGC_PROFILE=1 timeout 40 ./mgc nets/resnet18.net --devices "$(dev cuda:0)" --epochs 1 --limit-train 2560 --limit-test 0 > /dev/null 2> "$R/profile.txt"
# the cost model (codegen/cost.c) against that profile, per kernel kind: the first GPU calibrates it
if phase resnet && [ $DRY = 0 ]; then
    step "the cost model's predictions against the profile (ResNet-18, batch 256, cuda:0)"
    ./mgc nets/resnet18.net --devices "$(dev cuda:0)" --emit kernels > "$R/cost.txt" 2>&1 &&
        $PY tests/gpu/cost_vs_measured.py "$R/profile.txt" "$R/cost.txt" | tee "$R/cost_vs_measured.txt"
fi

if phase lenet || phase resnet; then
step "table"
[ $DRY = 1 ] && echo "dry run: the cuda rows ran on cpu and cpu:2, PyTorch on the CPU, epochs of 2,560 examples"
[ $FAKE = 1 ] && echo "fake GPUs: the cuda rows ran on tests/fakecuda (the CPU; nothing to say of a GPU's speed), PyTorch on the CPU, epochs of 2,560 examples"
$PY - "$R" "$PHASES" "$TORCH_DEV" <<'EOF' | tee "$R/table.txt"
import json, os, sys
R = sys.argv[1]
def rec(f):
    try: return json.loads(open(os.path.join(R, f)).readline())
    except Exception: return None
print(f"{'net':10} {'run':22} {'examples/s':>11} {'s/epoch':>8} {'test acc':>9} {'x PyTorch':>10}")
for net in ("lenet", "resnet18"):
    if net.replace("18", "") not in sys.argv[2].split(","): continue
    t = rec(f"{net}-torch.jsonl")
    for run, f in (("mgc cuda:0", f"{net}-cuda:0.jsonl"), ("mgc cuda:0,cuda:0", f"{net}-cuda:0,cuda:0.jsonl"),
                   (f"PyTorch {sys.argv[3]}", f"{net}-torch.jsonl"), ("mgc cuda:0 bf16", f"{net}-cuda:0-bf16.jsonl"),
                   (f"PyTorch {sys.argv[3]} bf16", f"{net}-torch-bf16.jsonl")):
        r = rec(f)
        if not r:
            print(f"{net:10} {run:22} {'(failed)':>11}"); continue
        s = r.get("train_seconds", r.get("seconds"))
        ref = rec(f"{net}-torch-bf16.jsonl") if run.endswith("bf16") else t   # bf16 rows against PyTorch's autocast
        ratio = r["examples_per_s"] / ref["examples_per_s"] if ref else float("nan")
        print(f"{net:10} {run:22} {r['examples_per_s']:11,.0f} {s:8.2f} {r['test_acc']:9.3f} {ratio:10.2f}")
EOF
fi
echo
echo "gpu check: $fails failed, $((SECONDS - T0)) s; results in $R"
[ $fails -eq 0 ]
