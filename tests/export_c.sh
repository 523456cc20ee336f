#!/usr/bin/env bash
# mgc export --format c and cuda (issue 36 item 3): the evaluation program as a
# standalone library. Each export is made into an empty directory and built
# there by its own Makefile, with nothing of mgc's in the environment, and its
# example program's logits are compared with mgc predict's on the same images:
#   - without folding (--no-fold) bit for bit: the same kernels and schedule
#     over the same pieces of images (mgc predict --batch-size MODEL_MAX_BATCH,
#     the images a thread of the library runs together) (bn_lenet trained on
#     Fashion-MNIST, ResNet-18, LeNet; CUDA on the fake GPU)
#   - with BatchNorm folded into the layer before it within TOL of predict's,
#     relative to the largest logit, and the same predictions wherever the top
#     two logits are further apart than that (bn_lenet, ResNet-18, the zoo: every
#     net in nets/; a net with nothing folded bit for bit)
#   - contexts used from two threads at once give each its sequential logits
#     (bit for bit; a context of 1 thread and one of 2 the same to float rounding)
#   - the fixed files compile without a warning; bad input is refused
# The zoo's checkpoints are random (tests/export_c.py: BatchNorm's statistics
# away from 0 and 1), so no training program is compiled. Needs $MGC_DATA for
# the trained case. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
suite_setup export_c
export XDG_CACHE_HOME="$tmp/cache"
PY=/usr/bin/python3
H="$PY tests/export_c.py"
TOL=1e-5   # folded against unfolded, relative to the largest logit (measured: 2e-7 to 1.2e-6)
WARN="-std=c11 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror"

# export NAME CK [ARGS]: mgc export CK --format c into a new directory $tmp/NAME/lib
export_lib() {
    local name=$1 ck=$2; shift 2
    mkdir -p "$tmp/$name"
    "$MGC" export "$ck" --out "$tmp/$name/lib" "$@" > "$tmp/$name/export.log" 2>&1 ||
        { bad "$name: mgc export $*: $(tail -2 "$tmp/$name/export.log")"; return 1; }
}

# build NAME [MAKE ARGS]: the directory holds the export's files and nothing else, names no path of
# mgc's, and builds with its Makefile alone (no MGC_*, no kernel cache)
build() {
    local name=$1 dir=$tmp/$1/lib; shift
    local files
    files=$(cd "$dir" && ls | tr '\n' ' ')
    case "$files" in
        "Makefile mgc_predict.c model.c model.h model.safetensors model_cpu.c model_cpu.h model_st.c model_st.h "|\
        "Makefile mgc_predict.c model.c model.h model.safetensors model_cuda.c model_cuda.h model_image.c model_kernels.cu model_st.c model_st.h ") ;;
        *) bad "$name: the export holds $files"; return 1 ;;
    esac
    if grep -rlF "$PWD" "$dir" > /dev/null; then bad "$name: the export names $PWD"; return 1; fi
    (cd "$dir" && env -i PATH=/usr/local/bin:/usr/bin:/bin make -s "$@" > ../make.log 2>&1) ||
        { bad "$name: make: $(grep -m3 -E "error|Error" "$tmp/$name/make.log")"; return 1; }
}

# run NAME IMAGES: its mgc_predict on IMAGES into $tmp/NAME/lib.safetensors
run_lib() {
    (cd "$tmp/$1/lib" && ./mgc_predict "$2" "$tmp/$1/lib.safetensors") > "$tmp/$1/run.log" 2>&1 ||
        { bad "$1: mgc_predict: $(tail -2 "$tmp/$1/run.log")"; return 1; }
}

# predict NAME CK IMAGES [ARGS]: mgc predict's logits into $tmp/NAME/predict.safetensors
predict() {
    local name=$1 ck=$2 img=$3; shift 3
    mkdir -p "$tmp/$name"
    "$MGC" predict "$ck" "$img" --out "$tmp/$name/predict.safetensors" "$@" > "$tmp/$name/predict.log" 2>&1 ||
        { bad "$name: mgc predict: $(tail -2 "$tmp/$name/predict.log")"; return 1; }
}

# lib_batch NAME: the library's MODEL_MAX_BATCH, the images a thread runs together: mgc predict with
# --batch-size that runs the same pieces (a GEMM's sums may round otherwise at another number of rows)
lib_batch() { sed -n 's/^#define MODEL_MAX_BATCH \([0-9]*\).*/\1/p' "$tmp/$1/lib/model.h"; }

# same NAME REF TOL WHAT: the library's logits against REF's (0: bit for bit); the seconds since the case began
same() {
    local out
    if out=$($H compare "$tmp/$1/lib.safetensors" "$2" "$3" 2>&1); then ok "$1: $4: $out ($((SECONDS - t0)) s)"; else bad "$1: $4: $out"; fi
    t0=$SECONDS
}
t0=$SECONDS

# ------------------------------------------------------------ bn_lenet, trained: real statistics, real images
if [ -n "${MGC_DATA:-}" ] && [ -d "$MGC_DATA" ]; then
    "$MGC" nets/bn_lenet.net --epochs 1 --limit-train 4096 --limit-test 500 --lr 0.05 --normalize --save "$tmp/bn.safetensors" > "$tmp/train.log" 2>&1 ||
        bad "bn_lenet: training: $(tail -2 "$tmp/train.log")"
    $PY -c "
import gzip, sys, numpy, torch; sys.path.insert(0, 'tests'); import st
b = gzip.open('$MGC_DATA/t10k-images-idx3-ubyte.gz').read()
st.save({'images': torch.from_numpy(numpy.frombuffer(b, numpy.uint8, offset=16).reshape(-1, 28, 28)[:500].copy())}, '$tmp/fm500.safetensors')"
    if predict bn_lenet "$tmp/bn.safetensors" "$tmp/fm500.safetensors"; then
        P=$tmp/bn_lenet/predict.safetensors
        export_lib bn_nofold "$tmp/bn.safetensors" --format c --no-fold && build bn_nofold && run_lib bn_nofold "$tmp/fm500.safetensors" &&
            predict bn_nofold "$tmp/bn.safetensors" "$tmp/fm500.safetensors" --batch-size "$(lib_batch bn_nofold)" &&
            same bn_nofold "$tmp/bn_nofold/predict.safetensors" 0 "--no-fold, 500 Fashion-MNIST test images, normalised by the library, against mgc predict (pieces of $(lib_batch bn_nofold))"
        export_lib bn_fold "$tmp/bn.safetensors" --format c && build bn_fold && run_lib bn_fold "$tmp/fm500.safetensors" &&
            same bn_fold "$P" $TOL "4 BatchNorms folded, against mgc predict"
        # a batch of 128 (the library's MODEL_MAX_BATCH and predict's batches): 500 = 3 x 128 + 116
        predict bn_b128 "$tmp/bn.safetensors" "$tmp/fm500.safetensors" --batch-size 128 &&
            export_lib bn_b128 "$tmp/bn.safetensors" --format c --no-fold --batch-size 128 && build bn_b128 &&
            grep -q "define MODEL_MAX_BATCH 128 " "$tmp/bn_b128/lib/model.h" && run_lib bn_b128 "$tmp/fm500.safetensors" &&
            same bn_b128 "$tmp/bn_b128/predict.safetensors" 0 "--batch-size 128: pieces of 128 as predict's batches"
    fi
else
    echo "skip: MGC_DATA is not set: no trained case"
fi

# ------------------------------------------------------------ ResNet-18, normalised, with and without folding
$H checkpoint nets/resnet18.net "$tmp/r18.safetensors" 1 --normalize 0.2860,0.3530
$H images 1 28 28 40 "$tmp/img28.safetensors"
if predict r18 "$tmp/r18.safetensors" "$tmp/img28.safetensors"; then
    export_lib r18_nofold "$tmp/r18.safetensors" --format c --no-fold && build r18_nofold && run_lib r18_nofold "$tmp/img28.safetensors" &&
        predict r18_nofold "$tmp/r18.safetensors" "$tmp/img28.safetensors" --batch-size "$(lib_batch r18_nofold)" &&
        same r18_nofold "$tmp/r18_nofold/predict.safetensors" 0 "ResNet-18 --no-fold against mgc predict (pieces of $(lib_batch r18_nofold))"
    export_lib r18_fold "$tmp/r18.safetensors" --format c && build r18_fold && run_lib r18_fold "$tmp/img28.safetensors" &&
        same r18_fold "$tmp/r18/predict.safetensors" $TOL "ResNet-18, 20 BatchNorms folded, against mgc predict"
fi

# ------------------------------------------------------------ the zoo: each net built alone and run
for net in nets/*.net; do
    name=$(basename "$net" .net)
    [ "$name" = resnet18 ] || [ "$name" = bn_lenet ] && continue
    folds=$("$MGC" "$net" --emit infer-ir | grep -c "^#   %.* takes in ")
    t0=$SECONDS
    $H checkpoint "$net" "$tmp/$name.safetensors" 2 || { bad "$name: no checkpoint"; continue; }
    shape=$($PY -c "import sys; sys.path.insert(0, 'tests'); import st; print(st.load_metadata('$tmp/$name.safetensors')['input'].replace('x', ' '))")
    $H images $shape 6 "$tmp/$name.img.safetensors" 3
    tol=$TOL
    [ "$folds" = 0 ] && tol=0
    export_lib "$name" "$tmp/$name.safetensors" --format c && build "$name" &&
        predict "$name" "$tmp/$name.safetensors" "$tmp/$name.img.safetensors" --batch-size "$(lib_batch "$name")" &&
        run_lib "$name" "$tmp/$name.img.safetensors" &&
        same "$name" "$tmp/$name/predict.safetensors" $tol "$folds folded, against mgc predict (pieces of $(lib_batch "$name"))"
done

# ------------------------------------------------------------ contexts from two threads at once
if [ -x "$tmp/lenet/lib/mgc_predict" ]; then
    cat > "$tmp/lenet/lib/threads.c" << 'C'
#include "model.h"
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
enum { N = 300, PER = MODEL_INPUT_C * MODEL_INPUT_H * MODEL_INPUT_W };
static float x[N * PER], alone[2][N * MODEL_CLASSES], out[4][N * MODEL_CLASSES];
static mgc_model *ctx[2];
static void *work(void *arg) {
    long k = (long)arg;   /* threads 0, 1 on contexts 0, 1; 2, 3 share context 0 */
    for (int rep = 0; rep < 20; rep++)
        if (mgc_model_predict(ctx[k == 1], x, N, out[k])) return (void *)1;
    return NULL;
}
int main(void) {
    char err[512];
    for (long i = 0; i < N * PER; i++) x[i] = (float)((i * 2654435761u) % 256) / 255.0f;
    for (int k = 0; k < 2; k++)
        if (!(ctx[k] = mgc_model_new("model.safetensors", k + 1, err, sizeof err))) { fprintf(stderr, "%s\n", err); return 1; }
    for (int k = 0; k < 2; k++)
        if (mgc_model_predict(ctx[k], x, N, alone[k])) return 1;
    pthread_t t[4];
    for (long k = 0; k < 4; k++) pthread_create(&t[k], NULL, work, (void *)k);
    int bad = 0;
    for (int k = 0; k < 4; k++) { void *r; pthread_join(t[k], &r); bad |= r != NULL; }
    for (int k = 0; k < 4; k++) bad |= memcmp(out[k], alone[k == 1], sizeof alone[0]) != 0;
    /* one thread and two split each GEMM into other shares: the same to float rounding */
    float big = 0, diff = 0;
    for (int i = 0; i < N * MODEL_CLASSES; i++) {
        big = fabsf(alone[0][i]) > big ? fabsf(alone[0][i]) : big;
        diff = fabsf(alone[0][i] - alone[1][i]) > diff ? fabsf(alone[0][i] - alone[1][i]) : diff;
    }
    bad |= !(diff <= 1e-6f * big);
    float none[1];
    bad |= mgc_model_predict(ctx[0], NULL, 3, none) != -1 || !strstr(mgc_model_error(ctx[0]), "NULL");
    mgc_model_free(ctx[0]);
    mgc_model_free(ctx[1]);
    printf("%s (1 thread against 2: %g of the largest)\n", bad ? "differ" : "same", diff / big);
    return bad;
}
C
    if (cd "$tmp/lenet/lib" && cc -O2 -o threads threads.c libmodel.a -lopenblas -lm -lpthread && ./threads) > "$tmp/threads.log" 2>&1; then
        ok "LeNet: two contexts (1 and 2 threads) and one shared, predicting from 4 threads at once: each run's logits its context's sequential ones, bit for bit; $(tail -1 "$tmp/threads.log")"
    else
        bad "threads: $(tail -3 "$tmp/threads.log")"
    fi
fi

# ------------------------------------------------------------ the fixed files, with the project's warnings
if [ -f "$tmp/lenet/lib/model.h" ]; then
    d=$tmp/lenet/lib
    if cc $WARN -DMODEL_BLAS=1 -fsyntax-only export/clib/model_cpu.c && cc $WARN -fsyntax-only export/clib/model_st.c &&
       cc $WARN -I"$d" -fsyntax-only export/clib/mgc_predict.c > "$tmp/warn.log" 2>&1 &&
       { [ ! -f /usr/local/cuda/include/cuda.h ] || cc $WARN -I/usr/local/cuda/include -fsyntax-only export/clib/model_cuda.c; } >> "$tmp/warn.log" 2>&1; then
        ok "export/clib's files compile with -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror"
    else
        bad "export/clib's files warn: $(head -3 "$tmp/warn.log")"
    fi
fi

# ------------------------------------------------------------ CUDA: nvcc builds it; on the fake GPU, predict's logits
if [ -x /usr/local/cuda/bin/nvcc ] && [ -f "$tmp/lenet.safetensors" ] && nm "$MGC" 2> /dev/null | grep -q " cuda_launch"; then
    cuda_ck=$tmp/bn.safetensors
    [ -f "$cuda_ck" ] || { $H checkpoint nets/bn_lenet.net "$tmp/bncu.safetensors" 4; cuda_ck=$tmp/bncu.safetensors; }
    export_lib cu_nvcc "$cuda_ck" --format cuda && build cu_nvcc &&
        ok "bn_lenet --format cuda: nvcc compiles model_kernels.cu (sm_90) and the library links with -lcuda -lcublas"
    mkdir -p "$tmp/fake"
    if cc -std=gnu11 -O1 -fPIC -shared -w -I/usr/local/cuda/include -DFAKECUDA_SHIM="\"$PWD/tests/fakecuda/shim.h\"" \
          tests/fakecuda/fakecuda.c -o "$tmp/fake/libfakecuda.so" -lopenblas -ldl -lpthread -lrt; then
        ln -s libfakecuda.so "$tmp/fake/libcuda.so.1"
        cublas=$(objdump -p /usr/local/cuda/lib64/libcublas.so | awk '/SONAME/ { print $2 }')
        ln -s libfakecuda.so "$tmp/fake/$cublas"
        fake="LD_LIBRARY_PATH=$tmp/fake FAKECUDA_GPUS=1 OPENBLAS_NUM_THREADS=1"
        env $fake MGC_NVRTC=$tmp/fake/libfakecuda.so MGC_CUBLAS=$tmp/fake/libfakecuda.so \
            "$MGC" predict "$cuda_ck" "$tmp/img28.safetensors" --devices cuda:0 --out "$tmp/cu_predict.safetensors" > "$tmp/cu_predict.log" 2>&1 ||
            bad "mgc predict on the fake GPU: $(tail -2 "$tmp/cu_predict.log")"
        for fold in nofold fold; do
            name=cu_$fold
            export_lib $name "$cuda_ck" --format cuda $([ $fold = nofold ] && echo --no-fold) || continue
            # the kernels' image as the fake NVRTC makes it (nvcc's cubins cannot run here), then the rest by make
            $PY -c "
import ctypes, sys
lib = ctypes.CDLL('$tmp/fake/libfakecuda.so'); p = ctypes.c_void_p()
lib.nvrtcCreateProgram(ctypes.byref(p), open('$tmp/$name/lib/model_kernels.cu', 'rb').read(), b'k.cu', 0, None, None)
if lib.nvrtcCompileProgram(p, 2, (ctypes.c_char_p * 2)(b'--std=c++17', b'--gpu-architecture=sm_90')): sys.exit('fake NVRTC failed')
n = ctypes.c_size_t(); lib.nvrtcGetCUBINSize(p, ctypes.byref(n)); b = ctypes.create_string_buffer(n.value); lib.nvrtcGetCUBIN(p, b)
open('$tmp/$name/lib/model_kernels.fatbin', 'wb').write(b.raw)" || { bad "$name: the fake NVRTC"; continue; }
            (cd "$tmp/$name/lib" && touch model_kernels.fatbin && env -i PATH=/usr/bin:/bin make -s NVCC=false > ../make.log 2>&1) ||
                { bad "$name: make: $(tail -2 "$tmp/$name/make.log")"; continue; }
            (cd "$tmp/$name/lib" && env $fake ./mgc_predict "$tmp/img28.safetensors" "$tmp/$name/lib.safetensors") > "$tmp/$name/run.log" 2>&1 ||
                { bad "$name: mgc_predict on the fake GPU: $(grep -v "no version information" "$tmp/$name/run.log" | tail -2)"; continue; }
            [ $fold = nofold ] && same $name "$tmp/cu_predict.safetensors" 0 "--format cuda --no-fold on the fake GPU against mgc predict --devices cuda:0"
            [ $fold = fold ] && same $name "$tmp/cu_predict.safetensors" $TOL "--format cuda, folded, on the fake GPU against mgc predict --devices cuda:0"
        done
    else
        bad "tests/fakecuda/fakecuda.c does not build"
    fi
else
    echo "skip: no nvcc, or an mgc without CUDA: --format cuda not built"
fi

# ------------------------------------------------------------ bad input
if [ -f "$tmp/lenet.safetensors" ]; then
    touch "$tmp/afile"
    expect out-file 2 "is there and is not a directory" -- export "$tmp/lenet.safetensors" --format c --out "$tmp/afile"
    expect out-parent 1 "cannot make the directory $tmp/no/such" -- export "$tmp/lenet.safetensors" --format c --out "$tmp/no/such"
    expect no-fold-train 2 "--no-fold applies to --emit infer-ir and mgc export --format c|cuda" -- nets/lenet.net --no-fold
    expect no-fold-onnx 2 "--no-fold applies to" -- export "$tmp/lenet.safetensors" --format onnx --out "$tmp/x.onnx" --no-fold
    if [ -x "$tmp/lenet/lib/mgc_predict" ] && [ -f "$tmp/nin/lib/model.safetensors" ]; then
        (cd "$tmp/lenet/lib" && ./mgc_predict --weights "$tmp/nin/lib/model.safetensors" "$tmp/img28.safetensors" "$tmp/x.safetensors") > "$tmp/out" 2>&1
        rc=$?
        [ $rc = 1 ] && grep -q "no tensor 'conv1.weight' of this model" "$tmp/out" && ok "another net's weights refused, naming the tensor" ||
            bad "another net's weights: exit $rc, $(head -2 "$tmp/out")"
        (cd "$tmp/lenet/lib" && ./mgc_predict "$tmp/nin.img.safetensors" "$tmp/x.safetensors") > "$tmp/out" 2>&1
        rc=$?
        [ $rc = 1 ] && grep -q "images of 1x96x96; the model takes 1x28x28" "$tmp/out" && ok "images of another size refused" ||
            bad "images of another size: exit $rc, $(head -2 "$tmp/out")"
        head -c 100 "$tmp/lenet/lib/model.safetensors" > "$tmp/cut.safetensors"
        (cd "$tmp/lenet/lib" && ./mgc_predict --weights "$tmp/cut.safetensors" "$tmp/img28.safetensors" "$tmp/x.safetensors") > "$tmp/out" 2>&1
        rc=$?
        [ $rc = 1 ] && grep -q "not a safetensors file" "$tmp/out" && ok "a truncated weights file refused" ||
            bad "a truncated weights file: exit $rc, $(head -2 "$tmp/out")"
    fi
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
