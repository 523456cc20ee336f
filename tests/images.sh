#!/usr/bin/env bash
# Image folders (--data DIR with DIR/train/CLASS/NAME.png|jpg and DIR/test/..., torchvision's
# ImageFolder): Pillow (in .venv, from .ci/setup) writes 600 Fashion-MNIST images a set as
# grayscale PNG, as JPEG, and as 32x32 RGB PNG; mgc's first training batch (--dump-batch: the
# images as the net sees them, with their indices in ImageFolder's order) against Pillow's decode
# of the same files: the same bytes for PNG and JPEG, and for the RGB ones mgc's resize to the
# net's 3x28x28 within its rounding. Then: a run trains on them and keeps the classes' names in
# its checkpoint; the decoded cache is used again, and made again when a file changes; a corrupt
# image is named; a test class the training set lacks and an empty class are refused with the
# reason (an IMAGES=0 build's refusal: tests/builds.sh). Needs $MGC_DATA. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
suite_setup images
export XDG_CACHE_HOME="$tmp/cache"
PY=${MGC_VENV:-.venv}/bin/python
L=nets/lenet.net
if [ -z "${MGC_DATA:-}" ] || ! "$PY" -c "import PIL, numpy" 2> /dev/null; then
    echo "skip images: needs \$MGC_DATA and Pillow in ${MGC_VENV:-.venv} (bash .ci/setup)"
    [ "${CI:-}" = true ] && bad "CI has no \$MGC_DATA or no Pillow in .venv"
    echo "$pass passed, $fail failed"; [ $fail -eq 0 ]; exit
fi
D=$tmp/img
"$PY" tests/images_check.py make "$D" "$MGC_DATA" 600 || { bad "Pillow could not write the folders"; echo "$pass passed, $fail failed"; exit 1; }
for k in png jpg; do
    "$MGC" $L --data "$D/$k" --dump-batch "$tmp/$k.st" > "$tmp/out" 2>&1 &&
        "$PY" tests/images_check.py check "$D/$k" "$tmp/$k.st" gray > "$tmp/chk" 2>&1 &&
        ok "$k: $(tail -1 "$tmp/chk" | sed 's/^ok   //')" || { bad "$k: $(tail -2 "$tmp/out") $(tail -2 "$tmp/chk")"; }
done
"$MGC" $L --set in_channels=3 --data "$D/rgb" --dump-batch "$tmp/rgb.st" > "$tmp/out" 2>&1 &&
    "$PY" tests/images_check.py check "$D/rgb" "$tmp/rgb.st" rgb > "$tmp/chk" 2>&1 &&
    ok "rgb 32x32 resized to 28x28: $(tail -1 "$tmp/chk" | sed 's/^ok   //')" || bad "rgb: $(tail -2 "$tmp/out") $(tail -2 "$tmp/chk")"
# a run on them: the data said as images, the classes' names (the folders') in the checkpoint
if "$MGC" $L --data "$D/png" --epochs 2 --batch-size 50 --lr 0.1 --momentum 0.9 --normalize --save "$tmp/ck.safetensors" > "$tmp/out" 2>&1 &&
   grep -q "600 training and 600 test examples (images, 1x28x28, 10 classes)" "$tmp/out" &&
   /usr/bin/python3 -c "
import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
m = json.loads(raw[8:8 + struct.unpack('<Q', raw[:8])[0]])['__metadata__']
assert m['class_names'].split() == [f'class_{k}' for k in range(10)], m['class_names']" "$tmp/ck.safetensors"; then
    acc=$(awk '/^epoch 2\/2/ { for (i = 1; i < NF; i++) if ($i == "test" && $(i + 1) == "acc") print $(i + 2) }' "$tmp/out")
    ok "LeNet trains on the PNG folders (test acc $acc after 2 epochs of 600) and keeps the class names"
else
    bad "training on the folders: $(tail -3 "$tmp/out")"
fi
# the cache: there, used (no decoding), and made again when a file changes
[ -f "$D/png/.mgc-images-train-1x28x28.bin" ] && ok "the decoded images are cached beside them" || bad "no cache file in $D/png"
cp "$D/png/train/class_3/$(ls "$D/png/train/class_3" | head -1)" "$tmp/keep.png"
before=$(stat -c %y "$D/png/.mgc-images-train-1x28x28.bin")
"$MGC" $L --data "$D/png" --dump-batch "$tmp/png1.st" > /dev/null 2>&1
[ "$(stat -c %y "$D/png/.mgc-images-train-1x28x28.bin")" = "$before" ] && ok "the cache is used again while no file changes" ||
    bad "the cache was written again with no file changed"
first=$(ls "$D/png/train/class_0" | head -1)
cp "$D/png/train/class_1/$(ls "$D/png/train/class_1" | head -1)" "$D/png/train/class_0/$first"   # another image in its place
"$MGC" $L --data "$D/png" --dump-batch "$tmp/png2.st" > "$tmp/out" 2>&1 &&
    "$PY" tests/images_check.py check "$D/png" "$tmp/png2.st" gray > "$tmp/chk" 2>&1 &&
    [ "$(stat -c %y "$D/png/.mgc-images-train-1x28x28.bin")" != "$before" ] &&
    ok "a file replaced: the cache is made again (Pillow's pixels still)" || bad "after a change: $(tail -2 "$tmp/chk")"
# bad folders
C=$tmp/bad
mkdir -p "$C/train/a" "$C/train/b" "$C/test/a"
cp "$tmp/keep.png" "$C/train/a/1.png"; cp "$tmp/keep.png" "$C/train/b/1.png"; cp "$tmp/keep.png" "$C/test/a/1.png"
printf 'not a png at all' > "$C/train/b/2.png"
expect corrupt 1 "$C/train/b/2.png: not a PNG image libpng can read" -- $L --data "$C" --epochs 1
rm "$C/train/b/2.png"; printf '\377\330\377garbage' > "$C/train/b/3.jpg"
expect corrupt-jpeg 1 "$C/train/b/3.jpg: not a JPEG image libjpeg can read" -- $L --data "$C" --epochs 1
rm "$C/train/b/3.jpg"; mkdir -p "$C/test/z"; cp "$tmp/keep.png" "$C/test/z/1.png"
expect test-class 1 "$C/test/z: a test class the training set ($C/train) does not have" -- $L --data "$C" --epochs 1
rm -r "$C/test/z"; mkdir -p "$C/train/c"
expect empty-class 1 "$C/train/c: no .png or .jpg images in this class folder" -- $L --data "$C" --epochs 1
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
