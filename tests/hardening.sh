#!/usr/bin/env bash
# What a hostile local user, a cluster and a careless hand can do to a run
# (issue 24), each case against what mgc must do:
#   - the kernel cache: loaded only where nobody else could have written it
#     (directories owned by another uid, writable by others, planted entries
#     with a valid seal, a link of another uid's repointed while mgc runs,
#     links inside the cache; no shared fallback without HOME);
#   - ranks started differently under mpirun stop at once, naming the first
#     difference and each rank's value (issue 35: an option that makes one
#     rank leave, one byte of its data anywhere; a rank that never comes to
#     compare, after MGC_AGREE_SECONDS), and SIGTERM passed on to the ranks
#     ends mpirun with 143;
#   - SIGTERM and SIGHUP stop like Ctrl-C, at random moments: status
#     128 + signal, a message, the last finished epoch whole, no .tmp left;
#   - check mode's batch, --save/--log paths, long lines, numbers and the
#     environment are all checked, strictly, before any work;
#   - a checkpoint's numbers (issue 35): not finite, a variance below 0, the
#     optimizer's state missing, step counts out of range: refused; parameters
#     that stop being finite while the loss does not stop the run after the
#     epoch, before it is saved.
# Needs $MGC_DATA for the training cases. Prints "N passed, M failed".
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
suite_setup hardening
PY=/usr/bin/python3
export XDG_CACHE_HOME="$tmp/cache"
L=nets/lenet.net
MGC_ABS=$(cd "$(dirname "$MGC")" && pwd)/$(basename "$MGC")

# ---------------------------------------------------------------- the kernel cache
# A cache whose root or kernels directory belongs to another uid, or that
# others can write, or below a directory others can write (not sticky), is
# refused with what was found and the fix; a sticky one above (like /tmp) is fine.
if [ "$(id -u)" -eq 0 ]; then
    c="$tmp/own"; mkdir -p "$c/mgc/kernels"; chown 65534 "$c/mgc"
    XDG_CACHE_HOME="$c" expect cache-foreign-root 1 "$c/mgc belongs to uid 65534" -- $L --epochs 0
    c="$tmp/own2"; mkdir -p "$c/mgc/kernels"; chown 65534 "$c/mgc/kernels"
    XDG_CACHE_HOME="$c" expect cache-foreign-kernels 1 "is not trusted: $c/mgc/kernels belongs to uid 65534" -- $L --epochs 0
    XDG_CACHE_HOME="$c" expect cache-info-foreign 1 "is not trusted" -- --cache-info
else
    echo "skip cache cases with another uid's directories: not root (chown needs it)"
fi
c="$tmp/gw"; mkdir -p "$c/mgc/kernels"; chmod 0770 "$c/mgc/kernels"
XDG_CACHE_HOME="$c" expect cache-group-writable 1 "$c/mgc/kernels is writable by its group (mode 0770)" -- $L --epochs 0
c="$tmp/ow"; mkdir -p "$c/up"; chmod 0777 "$c/up"
XDG_CACHE_HOME="$c/up" expect cache-parent-writable 1 "$c/up is writable by its group and others (mode 0777)" -- $L --epochs 0
chmod 1777 "$c/up"   # sticky, as /tmp: others cannot rename what is the user's
XDG_CACHE_HOME="$c/up" expect cache-parent-sticky 0 "initialised" -- $L --epochs 0
ls -ld "$c/up/mgc" | grep -q '^drwx------' && ok "the cache directories mgc makes are its owner's alone (0700)" ||
    bad "cache-mode: $(ls -ld "$c/up/mgc")"

# A planted entry: a shared object whose constructor leaves a mark, put where
# the kernels of lenet go, with a seal anyone can compute. Owned by the user
# it is loaded (so the plant would work: the check below can fail); owned by
# another uid, or writable by others, it is never loaded, compiled again in
# its place, and the run succeeds.
c="$tmp/plant"
XDG_CACHE_HOME="$c" "$MGC" $L --epochs 0 > /dev/null 2>&1
so=$(ls "$c/mgc/kernels/"*.so 2> /dev/null | head -1)
printf '#include <stdio.h>\n__attribute__((constructor)) static void mark(void) { FILE *f = fopen("%s", "w"); if (f) fclose(f); }\n' \
    "$tmp/pwned" > "$tmp/plant.c"
plant() {  # mode owner: the planted .so and its valid seal in place of the entry
    cc -shared -fPIC -o "$so" "$tmp/plant.c" && chmod "$1" "$so" && chown "$2" "$so" &&
        $PY -c "
import sys
b = open(sys.argv[1], 'rb').read(); h = 0xcbf29ce484222325
for x in b: h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
open(sys.argv[1] + '.seal', 'w').write('%d %016x\n' % (len(b), h))" "$so"
}
if [ -z "$so" ]; then
    bad "cache-plant: no entry to plant over in $c"
else
    rm -f "$tmp/pwned"
    plant 0644 "$(id -u)" && XDG_CACHE_HOME="$c" "$MGC" $L --epochs 0 > "$tmp/out" 2>&1
    [ -e "$tmp/pwned" ] && ok "a planted entry of the user's own, sealed, is loaded (the plant works: the checks below can fail)" ||
        bad "cache-plant-control: the planted entry was not loaded: $(head -2 "$tmp/out")"
    for how in "0644 65534 belongs to uid 65534" "0666 $(id -u) is writable by its group and others" "0664 $(id -u) is writable by its group"; do
        set -- $how
        [ "$2" != "$(id -u)" ] && [ "$(id -u)" -ne 0 ] && continue
        rm -f "$tmp/pwned"
        plant "$1" "$2"
        XDG_CACHE_HOME="$c" "$MGC" $L --epochs 0 > "$tmp/out" 2>&1
        rc=$?
        if [ $rc -eq 0 ] && [ ! -e "$tmp/pwned" ] && grep -q "not loading the cached kernels $so: the file ${how#* * }" "$tmp/out" &&
           [ "$(stat -c %u "$so")" = "$(id -u)" ] && XDG_CACHE_HOME="$c" "$MGC" $L --epochs 0 -v 2>&1 | grep -q "found in cache $so"; then
            ok "a planted, sealed entry (mode $1, uid $2) is not loaded: compiled again in its place, the run succeeds"
        else
            bad "cache-plant (mode $1, uid $2): exit $rc, loaded: $([ -e "$tmp/pwned" ] && echo yes || echo no)"; head -3 "$tmp/out" | sed 's/^/    /'
        fi
    done
fi

# A symbolic link on the way to the cache that another user owns is refused,
# wherever it points: its owner could repoint it while the compiler runs (a
# shared sticky XDG_CACHE_HOME, where anyone may add a name "mgc"). Driven as an
# attacker would: a second process, as uid 65534, swaps the link between
# root's real cache (where the check would pass) and a directory of its own
# holding a planted, sealed shared object under the very name of lenet's
# kernels, as fast as it can, while root runs mgc again and again. Nothing
# planted is ever loaded; every run stops with status 1 naming the link.
if [ "$(id -u)" -eq 0 ] && setpriv --reuid=65534 --regid=65534 --clear-groups true 2> /dev/null; then
    chmod 0755 "$tmp"
    real="$tmp/real"; XDG_CACHE_HOME="$real" "$MGC" $L --epochs 0 > /dev/null 2>&1
    so_name=$(basename "$(ls "$real/mgc/kernels/"*.so | head -1)")
    shared="$tmp/shared"; mkdir -m 1777 "$shared"
    evil="$tmp/evil"; mkdir -p "$evil/mgc/kernels"
    cc -shared -fPIC -o "$evil/mgc/kernels/$so_name" "$tmp/plant.c"
    $PY -c "
import sys
b = open(sys.argv[1], 'rb').read(); h = 0xcbf29ce484222325
for x in b: h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
open(sys.argv[1] + '.seal', 'w').write('%d %016x\n' % (len(b), h))" "$evil/mgc/kernels/$so_name"
    chown -R 65534:65534 "$evil"; chmod -R go-w "$evil"
    rm -f "$tmp/pwned"
    setpriv --reuid=65534 --regid=65534 --clear-groups $PY -c "
import os, sys, time
link, targets, stop = sys.argv[1], sys.argv[2:4], time.time() + 120
i = 0
while time.time() < stop and not os.path.exists(sys.argv[4]):
    tmp_link = link + '.new'
    try:
        os.symlink(targets[i % 2], tmp_link); os.rename(tmp_link, link)   # repointed atomically
    except OSError:
        pass
    i += 1
" "$shared/mgc" "$real/mgc" "$evil/mgc" "$tmp/attacker-stop" &
    attacker=$!
    sleep 0.3
    runs=0 refused=0 other=""
    for try in 1 2 3 4 5 6 7 8; do
        XDG_CACHE_HOME="$shared" "$MGC" $L --epochs 0 > "$tmp/out" 2>&1
        rc=$?
        runs=$((runs + 1))
        if [ $rc -eq 1 ] && grep -q "is not trusted: $shared/mgc is a symbolic link that belongs to uid 65534" "$tmp/out"; then
            refused=$((refused + 1))
        else
            other="$other [try $try: exit $rc: $(head -c 200 "$tmp/out")]"
        fi
    done
    XDG_CACHE_HOME="$shared" "$MGC" --cache-clear > "$tmp/out-clear" 2>&1
    clear_rc=$?
    touch "$tmp/attacker-stop"; wait $attacker
    if [ ! -e "$tmp/pwned" ] && [ $refused -eq $runs ] && [ $clear_rc -eq 1 ] && [ -e "$evil/mgc/kernels/$so_name" ] &&
       [ -e "$real/mgc/kernels/$so_name" ] && grep -q "symbolic link that belongs to uid 65534" "$tmp/out-clear"; then
        ok "a link of another uid's swapped by it between root's cache and a planted one, $runs runs: none loaded, all stopped with status 1 naming it; --cache-clear refused too"
    else
        bad "cache-link-race: loaded: $([ -e "$tmp/pwned" ] && echo yes || echo no), $refused of $runs refused, --cache-clear exit $clear_rc;$other"
    fi
    # the same link owned by root (the user) in the shared directory: followed, and the cache used
    rm -f "$shared/mgc"; ln -s "$real/mgc" "$shared/mgc"
    XDG_CACHE_HOME="$shared" expect cache-link-own 0 "kernels found in cache $shared/mgc/kernels/$so_name" -- $L --epochs 0 -v
    [ ! -e "$tmp/pwned" ] || bad "cache-link-own: the plant was loaded"
    chmod 0700 "$tmp"
else
    echo "skip the cache link race: not root, or uid 65534 cannot run a program"
fi

# Inside the cache nothing is followed: kernels/ as a link is refused (mgc makes
# it a directory); a link named as an entry, or as a compile's work directory,
# is removed by --cache-clear as a link, and what it points to is left whole.
c="$tmp/links"; mkdir -p "$c/mgc" "$tmp/elsewhere/kernels"; ln -s "$tmp/elsewhere/kernels" "$c/mgc/kernels"
XDG_CACHE_HOME="$c" expect cache-kernels-link 1 "is not trusted: $c/mgc/kernels is a symbolic link (mgc makes it a directory)" -- $L --epochs 0
rm "$c/mgc/kernels"; mkdir -m 700 "$c/mgc/kernels"
mkdir -p "$tmp/victim/dir"; echo precious > "$tmp/victim/file"; echo precious > "$tmp/victim/dir/file"
ln -s "$tmp/victim/file" "$c/mgc/kernels/0123456789abcdef.so"
ln -s "$tmp/victim/dir" "$c/mgc/kernels/0123456789abcdef.build.0123456789ab"
if XDG_CACHE_HOME="$c" "$MGC" --cache-clear > "$tmp/out" 2>&1 && [ -z "$(ls -A "$c/mgc/kernels")" ] &&
   [ "$(cat "$tmp/victim/file" "$tmp/victim/dir/file")" = "$(printf 'precious\nprecious')" ]; then
    ok "--cache-clear removes links in the cache as links: what they point to is untouched"
else
    bad "cache-clear-links: $(cat "$tmp/out"); left $(ls -A "$c/mgc/kernels"); victim: $(ls -R "$tmp/victim" | tr '\n' ' ')"
fi
# (a link planted as the entry itself is never loaded: the plant cases above)

# Nothing in the cache's code opens, loads, renames or removes by a path that
# a link could redirect: every such call there is relative to a directory's
# descriptor (the *at calls), but for "/", /dev/null and /proc/self/fd/N.
calls=$(grep -nE '\b(open|fopen|opendir|dlopen|unlink|remove|rename|rmdir|mkdir|mkdtemp|stat|lstat|chmod|chown|utimensat|truncate)\(' \
        runtime/cache.c runtime/cc.c | grep -vE 'open\("/",|open\("/dev/null",|dlopen\(by_fd,|^[^:]*:[0-9]+:\s*(\*|/\*)')
home_stat=$(echo "$calls" | grep -c 'stat(home, &st)')
others=$(echo "$calls" | grep -v 'stat(home, &st)' | grep -c .)
[ "$others" -eq 0 ] && ok "the cache's code calls no path-based open, load, rename or remove ($home_stat stat of \$HOME, to choose the cache's place)" ||
    bad "cache-by-path: $(echo "$calls" | grep -v 'stat(home, &st)' | head -5)"

# No HOME and no XDG_CACHE_HOME, and no home in the passwd entry (nobody's is
# /nonexistent): a private directory for the run, gone at its end; never the
# old shared /tmp/.cache/mgc.
if [ "$(id -u)" -eq 0 ] && setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$MGC_ABS" -a -r $L 2> /dev/null; then
    mkdir -p "$tmp/nobody-tmp"; chmod 1777 "$tmp/nobody-tmp"; chmod 0755 "$tmp"
    setpriv --reuid=65534 --regid=65534 --clear-groups env -i PATH=/usr/bin:/bin TMPDIR="$tmp/nobody-tmp" "$MGC_ABS" $L --epochs 0 -v > "$tmp/out" 2>&1
    rc=$?
    chmod 0700 "$tmp"
    if [ $rc -eq 0 ] && grep -q "compiled into $tmp/nobody-tmp/mgc-kernels-" "$tmp/out" && grep -q "compiled kernels .* -> $tmp/nobody-tmp/mgc-kernels-" "$tmp/out" &&
       [ -z "$(ls -A "$tmp/nobody-tmp")" ]; then
        ok "no home: the kernels go to a private directory for the run, removed at its end"
    else
        bad "cache-no-home: exit $rc, left: $(ls -A "$tmp/nobody-tmp")"; grep -i "cache\|kernels\|error" "$tmp/out" | head -3 | sed 's/^/    /'
    fi
else
    echo "skip the no-home case: not root, or uid 65534 cannot run $MGC_ABS"
fi

# --------------------------------------------------------------- the environment
MGC_CACHE_MB=abc expect env-cache-mb 2 "MGC_CACHE_MB='abc' is not a size in MB" -- $L --epochs 0
MGC_CACHE_MB=0x10 expect env-cache-mb-hex 2 "MGC_CACHE_MB='0x10' is not a size in MB" -- --cache-info
MGC_CACHE_MB=-5 expect env-cache-mb-negative 2 "MGC_CACHE_MB='-5'" -- $L --epochs 0
MGC_CACHE_MB=0.5 expect env-cache-mb-ok 0 "initialised" -- $L --epochs 0
XDG_CACHE_HOME=relative/dir expect env-xdg-relative 2 "XDG_CACHE_HOME='relative/dir' is not an absolute path" -- $L --epochs 0
OPENBLAS_CORETYPE=Bogus expect env-blas-bogus 2 "OPENBLAS_CORETYPE=Bogus: OpenBLAS does not take it and runs its" -- $L --epochs 0
OPENBLAS_CORETYPE=Bogus expect env-blas-bogus-version 0 "which it does not take" -- --version
MGC_FUSE=2 expect env-fuse 2 "MGC_FUSE='2' is not one of 0|1" -- $L --epochs 0
for arg in "--lr 0x10" "--lr inf" "--lr 1e" "--momentum 0x0.8" "--epochs +1x" "--bucket-mb 0x19" "--seed 0x5" "--limit-train 1e3"; do
    set -- $arg
    expect "number $arg" 2 "$1 expects a" -- $L --epochs 0 $arg
done
expect number-spaces 2 "--epochs expects a whole number, got ' 1'" -- $L --epochs " 1"
expect set-hex 2 "classes" -- $L --epochs 0 --set classes=0x10
expect numbers-decimal 0 "initialised" -- $L --epochs 0 --lr .05 --momentum 9e-1 --weight-decay 5E-4 --set classes=+10

# ----------------------------------------------------------- very long source lines
$PY -c "open('$tmp/long.net', 'w').write('net x {\n' + ' ' * 10_000_000 + '\$ ' + 'b' * 1000 + '\n}\n')"
t0=$(date +%s%N)
"$MGC" "$tmp/long.net" --emit ir > "$tmp/out" 2>&1
rc=$? ms=$(( ($(date +%s%N) - t0) / 1000000 )) bytes=$(wc -c < "$tmp/out")
if [ $rc -eq 1 ] && [ "$bytes" -lt 2000 ] && [ $ms -lt 3000 ] && grep -q "2:10000001: error" "$tmp/out" && grep -q '| \.\.\. .*\$ bbb.*\.\.\.$' "$tmp/out"; then
    ok "an error on a 10 MB line: $bytes bytes of message (a window round the caret), $ms ms"
else
    bad "long-line: exit $rc, $bytes bytes, $ms ms"; head -c 400 "$tmp/out" | sed 's/^/    /'
fi

# ----------------------------------------------------------- files mgc writes
t0=$SECONDS
expect save-missing-dir 2 "--save $tmp/nowhere/ck.st: the directory $tmp/nowhere does not exist" -- $L --epochs 3 --save "$tmp/nowhere/ck.st"
[ $((SECONDS - t0)) -lt 5 ] && ok "a --save into no directory is refused before any work ($((SECONDS - t0)) s)" || bad "save-early: $((SECONDS - t0)) s"
mkfifo "$tmp/fifo"
expect save-fifo 2 "--save $tmp/fifo is a FIFO" -- $L --epochs 1 --save "$tmp/fifo"
[ -p "$tmp/fifo" ] && ok "the FIFO is left a FIFO" || bad "save-fifo: the FIFO was replaced"
# a device node of the test's own as root (a regressed mgc must not replace /dev/null); else /dev/null, which
# nobody else can replace
dev=/dev/null
[ "$(id -u)" -eq 0 ] && mknod "$tmp/null" c 1 3 && dev="$tmp/null"
expect save-device 2 "--save $dev is a character device" -- $L --epochs 1 --save "$dev"
[ -c "$dev" ] && ok "the device node is left a device node" || bad "save-device: $dev was replaced"
expect save-directory 2 "is a directory" -- $L --epochs 1 --save "$tmp"
expect dump-missing-dir 2 "--dump $tmp/nowhere/d.st: the directory" -- $L --check-batch "$tmp/none.st" --dump "$tmp/nowhere/d.st"
expect log-missing-dir 2 "--log $tmp/nowhere/l.jsonl: the directory $tmp/nowhere does not exist" -- $L --epochs 1 --log "$tmp/nowhere/l.jsonl"
mkdir -p "$tmp/ro"; chmod 0555 "$tmp/ro"
if [ "$(id -u)" -ne 0 ]; then expect save-read-only 2 "cannot write into the directory $tmp/ro" -- $L --epochs 1 --save "$tmp/ro/ck.st"; fi
# a symbolic link is followed: its target replaced, atomically; the link stays
mkdir -p "$tmp/real"; ln -s real/ck.st "$tmp/link.st"; echo "stale" > "$tmp/real/ck.st.tmp"
if "$MGC" $L --epochs 0 --save "$tmp/link.st" > "$tmp/out" 2>&1 && [ -L "$tmp/link.st" ] && [ -f "$tmp/real/ck.st" ] &&
   [ ! -e "$tmp/real/ck.st.tmp" ] && $PY -c "import sys; sys.path.insert(0, 'tests'); import st; st.load(sys.argv[1])" "$tmp/link.st"; then
    ok "--save onto a symbolic link replaces its target and keeps the link; a stale .tmp of a killed run is gone"
else
    bad "save-symlink: $(ls -la "$tmp/link.st" "$tmp/real" 2>&1 | tr '\n' ' ')"
fi

# ----------------------------------------------------------- large safetensors headers
# A header of 80,000 empty tensors (4.6 MB, under the 100 MB limit) is parsed
# in linear time and memory (it took minutes and hundreds of MB): --data,
# --load and --resume each say what the file lacks, within a hang guard of 30 s;
# LeNet's checkpoint with those 80,000 tensors added loads (found by name).
$PY -c "
import json, struct, sys
h = '{' + ','.join('\"t%d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}' % i for i in range(80000)) + '}'
h += ' ' * (-len(h) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h.encode())" "$tmp/many.st"
"$MGC" $L --epochs 0 --save "$tmp/lenet.st" > /dev/null 2>&1   # (the kernels compiled: the times below are the files')
mkdir -p "$tmp/many"; cp "$tmp/many.st" "$tmp/many/train.safetensors"; cp "$tmp/many.st" "$tmp/many/test.safetensors"
timed() {  # name status text -- args: expect, and the seconds it took
    local t0; t0=$(date +%s%N)
    expect "$@"
    echo "note $1: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
}
MGC_EXPECT_TIMEOUT=30
timed st-80000-data 1 "train.safetensors: no tensor \`images\`: a data set file holds" -- $L --data "$tmp/many" --epochs 1
grep -q "this one holds t0, t1, .* and [0-9]* more" "$tmp/out" && ok "the data set's message lists a few of the 80,000 names and counts the rest" ||
    bad "st-80000-data-names: $(head -c 300 "$tmp/out")"
timed st-80000-load 1 "many.st: checkpoint has no tensor 'conv1.weight'" -- $L --load "$tmp/many.st" --epochs 0
timed st-80000-resume 1 "many.st: the checkpoint does not say its epoch" -- $L --resume "$tmp/many.st" --epochs 1
$PY -c "
import sys, torch; sys.path.insert(0, 'tests'); import st
t = st.load(sys.argv[1]); m = st.load_metadata(sys.argv[1])
t.update(('t%d' % i, torch.zeros(0)) for i in range(80000))
st.save(t, sys.argv[2], m)" "$tmp/lenet.st" "$tmp/lenet-many.st"
timed st-80000-load-good 0 "loaded from $tmp/lenet-many.st" -- $L --load "$tmp/lenet-many.st" --epochs 0
unset MGC_EXPECT_TIMEOUT

# ----------------------------------------------------------- memory: the cgroup's limit, the data set
# The data set is counted before it is read (its headers say how large it
# will be): one too large for this process's memory is refused with status 1
# and the figures, never read into an out-of-memory kill. Anywhere: IDX
# headers that promise 100 TB (the data itself left out). Where root can make
# a memory cgroup below its own (v1 or v2), under a 256 MB limit there: a
# 314 MB IDX set (real, zeros) is refused naming that cgroup, where it was
# read until the kernel killed mgc (137); Fashion-MNIST beside a net too wide
# for the rest gets the --batch-size that fits; LeNet on Fashion-MNIST runs.
if [ -n "${MGC_DATA:-}" ] && [ -d "$MGC_DATA" ]; then
    mkdir -p "$tmp/huge"
    $PY -c "
import gzip, struct, sys
for name, head in [('train-images-idx3-ubyte', (0x803, 100000000, 1000, 1000)), ('t10k-images-idx3-ubyte', (0x803, 10, 1000, 1000)),
                   ('train-labels-idx1-ubyte', (0x801, 100000000)), ('t10k-labels-idx1-ubyte', (0x801, 10))]:
    with gzip.open(sys.argv[1] + '/' + name + '.gz', 'wb') as f: f.write(struct.pack('>%dI' % len(head), *head))" "$tmp/huge"
    expect data-huge 1 "needs 91.0 TiB on this machine (the data set in $tmp/huge, 100,000,010 IDX examples, 91.0 TiB;" -- $L --data "$tmp/huge" --epochs 1
    grep -q "mgc: the data set alone takes 91.0 TiB of the" "$tmp/out" && ok "a data set of 100 TB (by its headers) is refused before it is read" ||
        bad "data-huge-alone: $(tail -2 "$tmp/out")"
    # a memory cgroup of the test's own below this process's: v1's memory controller, else v2's
    cg="" cg_file=""
    mem1=$(awk '$0 ~ / - cgroup cgroup / && $NF ~ /(^|,)memory(,|$)/ && $4 == "/" { print $5; exit }' /proc/self/mountinfo)
    path1=$(grep -E '^[0-9]+:([^:]*,)?memory(,[^:]*)?:' /proc/self/cgroup | cut -d: -f3)
    mem2=$(awk '$0 ~ / - cgroup2 / && $4 == "/" { print $5; exit }' /proc/self/mountinfo)
    path2=$(grep '^0::' /proc/self/cgroup | cut -d: -f3)
    if [ "$(id -u)" -eq 0 ] && [ -n "$mem1" ] && [ -n "$path1" ] && mkdir "$mem1${path1%/}/mgc-test-$$" 2> /dev/null; then
        cg="$mem1${path1%/}/mgc-test-$$" cg_file=memory.limit_in_bytes
    elif [ "$(id -u)" -eq 0 ] && [ -n "$mem2" ] && [ -n "$path2" ] && grep -qw memory "$mem2${path2%/}/cgroup.controllers" 2> /dev/null &&
         echo +memory > "$mem2${path2%/}/cgroup.subtree_control" 2> /dev/null && mkdir "$mem2${path2%/}/mgc-test-$$" 2> /dev/null; then
        cg="$mem2${path2%/}/mgc-test-$$" cg_file=memory.max
    fi
    if [ -n "$cg" ] && echo $((256 << 20)) > "$cg/$cg_file" 2> /dev/null; then
        trap 'rmdir "$cg" 2> /dev/null; rm -rf "$tmp"' EXIT
        printf '#!/bin/sh\necho $$ > "%s/cgroup.procs" || exit 99\nexec "%s" "$@"\n' "$cg" "$MGC_ABS" > "$tmp/in-cgroup"
        chmod +x "$tmp/in-cgroup"
        name="${cg#"${mem1:-$mem2}"}"
        mkdir -p "$tmp/big"
        cp "$MGC_DATA"/t10k-* "$tmp/big/"
        $PY -c "
import gzip, struct, sys
n = 400000
with gzip.open(sys.argv[1] + '/train-images-idx3-ubyte.gz', 'wb', compresslevel=1) as f:
    f.write(struct.pack('>IIII', 0x803, n, 28, 28)); z = bytes(1 << 24); left = n * 784
    while left: k = min(left, len(z)); f.write(z[:k]); left -= k
with gzip.open(sys.argv[1] + '/train-labels-idx1-ubyte.gz', 'wb') as f: f.write(struct.pack('>II', 0x801, n) + bytes(n))" "$tmp/big"
        "$MGC" $L --epochs 0 > /dev/null 2>&1   # LeNet's kernels compiled outside the limit
        MGC="$tmp/in-cgroup" expect cgroup-data 1 "but 2" -- $L --data "$tmp/big" --epochs 1
        grep -q "is available to this process (cgroup $name $cg_file: 256.0 MiB, " "$tmp/out" && grep -q "the data set alone takes 3" "$tmp/out" &&
            ok "a 314 MB data set under a 256 MB cgroup ($name): refused with status 1 and the cgroup's figures, not killed" ||
            bad "cgroup-data-figures: $(head -c 600 "$tmp/out")"
        cat > "$tmp/wide.net" <<'NET'
net wide(classes = 10) {
    input x[N, 1, 28, 28]
    return x -> c1: conv2d(256, kernel = 3, padding = 1) -> relu -> global_avgpool -> flatten -> fc: linear(classes) -> softmax_cross_entropy
}
NET
        MGC="$tmp/in-cgroup" expect cgroup-batch 1 "would fit (" -- "$tmp/wide.net" --epochs 1 --batch-size 1024
        grep -q "beside the data set" "$tmp/out" && grep -q "the data set in $MGC_DATA, 70,000 IDX examples" "$tmp/out" &&
            ok "Fashion-MNIST and a net too wide for the rest of 256 MB: the --batch-size that fits beside the data set" ||
            bad "cgroup-batch-beside: $(head -c 600 "$tmp/out")"
        MGC="$tmp/in-cgroup" expect cgroup-fits 0 "epoch 1/1" -- $L --epochs 1 --limit-train 1024 --limit-test 256
    else
        echo "skip the cases under a cgroup of 256 MB: not root, or no memory cgroup could be made here (unit_runtime checks a fake tree)"
    fi
else
    echo "skip the data set's memory: no \$MGC_DATA"
fi

# ----------------------------------------------------------- a full disk under --log
# A --log that cannot be written (the disk full) stops the run after that
# epoch with status 1, its checkpoint saved, as docs/guarantees.md says (it
# went on without the log). /dev/full (a character device --log takes, as
# /dev/stdout) fails every write with ENOSPC; a tmpfs of 64 KiB filled to the
# last block is a real full file system, where root may mount one.
if [ -n "${MGC_DATA:-}" ] && [ -d "$MGC_DATA" ]; then
    A="--epochs 3 --limit-train 512 --limit-test 128"
    expect log-dev-full 1 "mgc: cannot write --log /dev/full: No space left on device" -- $L $A --log /dev/full
    grep -q "stopped after epoch 1 of 3: its --log entry could not be written" "$tmp/out" && ! grep -q "^epoch 2/3" "$tmp/out" &&
        ok "--log /dev/full: the run stops after epoch 1 with status 1" || bad "log-dev-full-stops: $(tail -3 "$tmp/out")"
    mkdir -p "$tmp/small"
    if [ "$(id -u)" -eq 0 ] && mount -t tmpfs -o size=64k tmpfs "$tmp/small" 2> /dev/null; then
        dd if=/dev/zero of="$tmp/small/fill" bs=4k 2> /dev/null   # until the file system is full
        expect log-full-disk 1 "mgc: cannot write --log $tmp/small/log.jsonl: No space left on device" -- $L $A --log "$tmp/small/log.jsonl" --save "$tmp/full.st"
        held=$($PY -c "import sys; sys.path.insert(0, 'tests'); import st; print(st.load_metadata(sys.argv[1])['epoch'])" "$tmp/full.st" 2> /dev/null)
        grep -q "stopped after epoch 1 of 3: its --log entry could not be written; the checkpoint holds it: $tmp/full.st" "$tmp/out" &&
            [ "$held" = 1 ] && ok "--log on a full tmpfs: stopped after epoch 1 with status 1, epoch 1 saved" ||
            bad "log-full-disk-stops: checkpoint epoch '$held', $(tail -2 "$tmp/out")"
        umount "$tmp/small"
    else
        echo "skip --log on a full tmpfs: not root, or no tmpfs can be mounted here (--log /dev/full is checked)"
    fi
else
    echo "skip the full disk under --log: no \$MGC_DATA"
fi

# ----------------------------------------------------------- check mode's batch
for bad_label in 10 200 -1 1e9 nan 2.5; do
    $PY -c "
import sys; sys.path.insert(0, 'tests'); import st, torch
st.save({'x': torch.rand(4, 1, 28, 28), 'y': torch.tensor([1.0, 2.0, float('$bad_label'), 0.0])}, '$tmp/b.st')"
    expect "batch-label-$bad_label" 1 "label 2 of 'y' is" -- $L --check-batch "$tmp/b.st" --steps 1
done
$PY -c "
import sys; sys.path.insert(0, 'tests'); import st, torch
x = torch.rand(4, 1, 28, 28); x[3, 0, 5, 7] = float('nan')
st.save({'x': x, 'y': torch.tensor([1, 2, 3, 0])}, '$tmp/b.st')"
expect batch-input-nan 1 "'x' holds nan at element 2499 (example 3): the inputs must be finite" -- $L --check-batch "$tmp/b.st" --steps 1
$PY -c "
import sys; sys.path.insert(0, 'tests'); import st, torch
st.save({'x': torch.rand(4, 1, 28, 28), 'y': torch.tensor([1, 2, 9, 0])}, '$tmp/b.st')"
expect batch-good 0 "step 1  loss" -- $L --check-batch "$tmp/b.st" --steps 1

# ----------------------------------------------------------- numbers in checkpoints
# A checkpoint's tensors are finite (a variance, running_var or exp_avg_sq, not
# below 0), --resume's optimizer state is all there and its step counts in range,
# or mgc refuses it, status 1, naming the tensor (issue 35: each of these trained
# on, exited 0 and saved NaN over the checkpoint). And a run whose parameters stop
# being finite while its loss stays finite (ReLU and max-pooling make numbers of
# NaN) stops after that epoch, the checkpoint on disk the epoch before's.
if [ -n "${MGC_DATA:-}" ] && [ -d "$MGC_DATA" ]; then
    S="--limit-train 512 --limit-test 64"
    # edit SRC OUT [--drop NAME] [--set NAME INDEX VALUE] [--fill NAME VALUE] [--meta KEY VALUE]: OUT is SRC, changed
    cat > "$tmp/edit.py" <<'PY'
import sys; sys.path.insert(0, 'tests'); import st, torch
src, out, args = sys.argv[1], sys.argv[2], sys.argv[3:]
t, m = st.load(src), st.load_metadata(src)
while args:
    op = args.pop(0)
    if op == '--drop': del t[args.pop(0)]
    elif op == '--set': name, i, v = args.pop(0), int(args.pop(0)), float(args.pop(0)); t[name].view(-1)[i] = v
    elif op == '--fill': name, v = args.pop(0), float(args.pop(0)); t[name].fill_(v)
    elif op == '--meta': k = args.pop(0); m[k] = args.pop(0)
st.save(t, out, m)
PY
    edit() { $PY "$tmp/edit.py" "$@"; }
    if "$MGC" $L --optimizer adamw --lr 0.001 --epochs 1 $S --save "$tmp/aw.st" > "$tmp/out" 2>&1; then
        cp "$tmp/aw.st" "$tmp/intact.st"   # the control: each change below is what is refused
        expect adamw-resume-intact 0 "epoch 2/2" -- $L --optimizer adamw --lr 0.001 --epochs 2 $S --resume "$tmp/intact.st"
        edit "$tmp/aw.st" "$tmp/ed.st" --set fc1.weight.exp_avg_sq 7 -1
        expect adamw-negative-exp-avg-sq 1 "ed.st: optimizer state 'fc1.weight.exp_avg_sq' holds 1 value below 0, which a variance cannot be, of 30720 (the first, element 7, is -1)" -- $L --optimizer adamw --epochs 2 $S --resume "$tmp/ed.st"
        expect adamw-negative-load 1 "optimizer state 'fc1.weight.exp_avg_sq' holds 1 value below 0" -- $L --optimizer adamw --epochs 0 --load "$tmp/ed.st"
        edit "$tmp/aw.st" "$tmp/ed.st" --set fc2.weight.exp_avg 3 nan
        expect adamw-nan-exp-avg 1 "optimizer state 'fc2.weight.exp_avg' holds 1 value that is not finite, of 10080 (the first, element 3, is nan)" -- $L --optimizer adamw --epochs 2 $S --resume "$tmp/ed.st"
        edit "$tmp/aw.st" "$tmp/ed.st" --drop fc3.weight.exp_avg_sq
        expect adamw-missing-exp-avg-sq 1 "ed.st: checkpoint has no tensor 'fc3.weight.exp_avg_sq' of its optimizer's state (adamw betas 0.9,0.999 eps 1e-08 weight decay 0.01)" -- $L --optimizer adamw --epochs 2 $S --resume "$tmp/ed.st"
        expect adamw-missing-sgd 0 "its state starts afresh" -- $L --epochs 2 $S --resume "$tmp/ed.st"   # SGD's own state: none of AdamW's needed
        edit "$tmp/aw.st" "$tmp/ed.st" --meta optimizer_steps 18446744073709551615
        expect adamw-optimizer-steps 1 "ed.st: the checkpoint's optimizer_steps is 18446744073709551615, more than its steps (2)" -- $L --optimizer adamw --epochs 2 $S --resume "$tmp/ed.st"
        edit "$tmp/aw.st" "$tmp/ed.st" --meta steps 9007199254740993 --meta optimizer_steps 9007199254740993
        expect adamw-steps 1 "the checkpoint's steps is 9007199254740993, more than 2^53" -- $L --optimizer adamw --epochs 2 $S --resume "$tmp/ed.st"
    else
        bad "numbers: no AdamW checkpoint to change: $(tail -2 "$tmp/out")"
    fi
    # BatchNorm's running_var below 0: evaluation would take the square root of it
    cat > "$tmp/bnr.net" <<'NET'
net bnr(classes = 10) {
    input x[N, 1, 28, 28]
    return x -> conv1: conv2d(4, kernel = 5) -> bn1: batchnorm2d -> relu -> maxpool2d(2)
             -> flatten -> fc: linear(classes) -> softmax_cross_entropy
}
NET
    if "$MGC" "$tmp/bnr.net" --epochs 1 $S --save "$tmp/bn.st" > "$tmp/out" 2>&1; then
        edit "$tmp/bn.st" "$tmp/ed.st" --set bn1.running_var 2 -0.5
        expect running-var-negative 1 "running statistic 'bn1.running_var' holds 1 value below 0, which a variance cannot be, of 4 (the first, element 2, is -0.5)" -- "$tmp/bnr.net" --evaluate $S --load "$tmp/ed.st"
        # conv1's weights at 1e38 (finite): its outputs overflow, BatchNorm makes NaN of
        # them, ReLU zeros, and the loss stays ln 10 while the step writes NaN into conv1
        # and bn1; epoch 2 must stop, before its checkpoint, the file untouched
        edit "$tmp/bn.st" "$tmp/big.st" --fill conv1.weight 1e38
        sum=$(md5sum < "$tmp/big.st")
        expect epoch-nonfinite 1 "after epoch 2, parameter 'conv1.weight' holds 100 values that are not finite, of 100" -- "$tmp/bnr.net" --epochs 3 $S --resume "$tmp/big.st"
        grep -qF "training diverged, though the loss stayed finite (ReLU and max-pooling make numbers of NaN); $tmp/big.st keeps epoch 1, whose tensors were finite" "$tmp/out" &&
            [ "$(md5sum < "$tmp/big.st")" = "$sum" ] && ! grep -q "^epoch 2/3" "$tmp/out" &&
            ok "parameters not finite after epoch 2 (the loss finite): status 1, the checkpoint of epoch 1 kept byte for byte" ||
            bad "epoch-nonfinite-kept: $(tail -2 "$tmp/out")"
        # the same where the device's memory is apart from the host's (the tensors downloaded to be checked)
        MGC_CPU_OWN_MEMORY=1 expect epoch-nonfinite-own-memory 1 "after epoch 2, parameter 'conv1.weight' holds 100 values that are not finite" -- "$tmp/bnr.net" --epochs 2 $S --resume "$tmp/big.st"
        expect epoch-nonfinite-cpu2 1 "after epoch 1, parameter 'conv1.weight' holds 100 values that are not finite, of 100" -- "$tmp/bnr.net" --epochs 2 $S --load "$tmp/big.st" --devices cpu:2 --save "$tmp/c2.st"
        grep -q "; nothing was saved; try a smaller --lr" "$tmp/out" && [ ! -e "$tmp/c2.st" ] &&
            ok "the same on two devices from --load: status 1 after epoch 1, nothing saved" || bad "epoch-nonfinite-cpu2: $(tail -1 "$tmp/out")"
        # check mode saves after its steps: not tensors that are not finite
        $PY -c "
import sys; sys.path.insert(0, 'tests'); import st, torch
st.save({'x': torch.rand(4, 1, 28, 28), 'y': torch.tensor([1, 2, 3, 0])}, sys.argv[1])" "$tmp/batch.st"
        expect check-mode-nonfinite 1 "after 1 step, parameter 'conv1.weight' holds 100 values that are not finite, of 100" -- "$tmp/bnr.net" --check-batch "$tmp/batch.st" --steps 1 --load "$tmp/big.st" --save "$tmp/cm.st"
        grep -qF ": not saved to $tmp/cm.st" "$tmp/out" && [ ! -e "$tmp/cm.st" ] && ok "check mode: parameters not finite after its steps are not saved" ||
            bad "check-mode-nonfinite-saved: $(tail -1 "$tmp/out")"
    else
        bad "numbers: no BatchNorm checkpoint to change: $(tail -2 "$tmp/out")"
    fi
else
    echo "skip the checkpoint number cases: no \$MGC_DATA"
fi

# ----------------------------------------------------------- signals
# SIGTERM or SIGHUP at a random moment of a short run that saves every epoch:
# the run stops after the current step with status 128 + signal and a message
# naming it; no .tmp is left; the checkpoint, if any, is whole and holds the
# epoch the message names.
if [ -n "${MGC_DATA:-}" ] && [ -d "$MGC_DATA" ]; then
    signalled=0 good=0
    for try in $(seq 1 8); do
        sig=$([ $((try % 2)) -eq 0 ] && echo HUP || echo TERM)
        num=$([ $sig = HUP ] && echo 1 || echo 15)
        ck="$tmp/sig$try.st"
        "$MGC" $L --devices cpu:2 --epochs 4 --save "$ck" > "$tmp/sig.out" 2>&1 &
        pid=$!
        sleep "$($PY -c "import random; random.seed($try); print(round(random.uniform(0.1, 3.0), 2))")"
        kill -$sig $pid 2> /dev/null
        wait_for $pid 60
        rc=$?
        [ $rc -eq 0 ] && continue   # it finished first
        signalled=$((signalled + 1))
        held=$($PY -c "import sys; sys.path.insert(0, 'tests'); import st; st.load(sys.argv[1]); print(st.load_metadata(sys.argv[1])['epoch'])" "$ck" 2> /dev/null)
        said=$(grep -o "interrupted by SIG[A-Z]*[^;]*" "$tmp/sig.out")
        want=""
        case "$said" in
            *"during epoch"*) want=$(( ${said##* } - 1 )) ;;
            *"after epoch"*) want=${said##* } ;;
        esac
        [ "$want" = 0 ] && want=""
        if [ $rc -eq $((128 + num)) ] && [[ $said == "interrupted by SIG$sig"* ]] && ! ls "$tmp"/sig$try.st.tmp > /dev/null 2>&1 &&
           [ "$held" = "$want" ]; then
            good=$((good + 1))
        else
            bad "SIG$sig at try $try: exit $rc, said '$said', checkpoint epoch '$held' (want '$want'), $(ls "$tmp" | grep -c "sig$try.st.tmp") .tmp"
        fi
    done
    [ $good -eq $signalled ] && [ $signalled -ge 5 ] &&
        ok "SIGTERM/SIGHUP at random moments: $good of $good runs stopped with 128+signal, named it, kept their last epoch, left no .tmp"
    [ $signalled -lt 5 ] && bad "signals: only $signalled of 8 runs were signalled before they ended"
    # while a large checkpoint is written (ResNet-18, 45 MB, --epochs 0, the
    # kernels cached): at random moments through a whole run's length, the
    # checkpoint is finished (exit 0) or never begun (143), never left half
    "$MGC" nets/resnet18.net --epochs 0 > /dev/null 2>&1   # the kernels compiled and cached
    t0=$(date +%s%N)
    "$MGC" nets/resnet18.net --epochs 0 --save "$tmp/big0.st" > /dev/null 2>&1
    whole=$(( ($(date +%s%N) - t0) / 1000000 ))
    done_=0 stopped=0 wrong=0
    for try in 1 2 3 4 5 6 7 8; do
        ck="$tmp/big$try.st"
        "$MGC" nets/resnet18.net --epochs 0 --save "$ck" > "$tmp/big.out" 2>&1 &
        pid=$!
        sleep "$($PY -c "import random; random.seed(10 + $try); print(round(random.uniform(0.4, 1.05) * $whole / 1000, 3))")"
        kill -TERM $pid 2> /dev/null
        wait_for $pid 60
        rc=$?
        if [ $rc -eq 0 ] && [ ! -e "$ck.tmp" ] && $PY -c "import sys; sys.path.insert(0, 'tests'); import st; st.load(sys.argv[1])" "$ck"; then
            done_=$((done_ + 1))
        elif [ $rc -eq 143 ] && [ ! -e "$ck" ] && [ ! -e "$ck.tmp" ] && grep -q "interrupted by SIGTERM before the training began" "$tmp/big.out"; then
            stopped=$((stopped + 1))
        else
            wrong=$((wrong + 1))
            bad "SIGTERM while saving ResNet-18 (try $try): exit $rc, $(ls "$tmp" | grep "big$try" | tr '\n' ' ')"; tail -2 "$tmp/big.out" | sed 's/^/    /'
        fi
    done
    [ $wrong -eq 0 ] && ok "SIGTERM through ResNet-18's initialise-and-save run ($whole ms): $done_ saved whole, $stopped stopped before, no .tmp"
else
    echo "skip the signal cases: no \$MGC_DATA"
fi

# ----------------------------------------------------------- ranks that disagree
# Under mpirun, ranks started with different options, nets, data or
# environment stop before anything is compiled or read (their data: once it
# is read, before the first step), all with status 2, rank 0 naming the
# first difference and which ranks have what.
if "$MGC" --version | grep -q "MPI       built with" && command -v mpirun > /dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
    MPI="timeout 60 mpirun --oversubscribe"
    A="--epochs 1 --limit-train 512 --limit-test 64"
    cp $L "$tmp/lenet2.net"; echo "# one more comment" >> "$tmp/lenet2.net"
    mkdir -p "$tmp/nodata"
    disagree() {  # name, text, then the two ranks' command lines separated by ::
        local name=$1 text=$2; shift 2
        local one=() two=() side=1
        for a in "$@"; do
            if [ "$a" = "::" ]; then side=2; elif [ $side = 1 ]; then one+=("$a"); else two+=("$a"); fi
        done
        local t0=$SECONDS
        $MPI -np 1 "${one[@]}" : -np 1 "${two[@]}" > "$tmp/mpi.out" 2>&1
        local rc=$?
        # each rank's value as shown: two different values never read alike
        local said vals zero one
        said=$(grep -m1 "were not started alike" "$tmp/mpi.out")
        vals=${said#* differs (rank 0: }; zero=${vals%%; rank 1: *}; one=${vals#*; rank 1: }; one=${one%)}
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$text" "$tmp/mpi.out" && grep -q "none has started" "$tmp/mpi.out" &&
           [ "$vals" != "$said" ] && [ "$zero" != "$one" ] &&
           grep -q "Exit code:    2" "$tmp/mpi.out" && ! grep -qE "Segmentation|double free|corruption" "$tmp/mpi.out"; then
            ok "mpirun, $name: both ranks stop with status 2 in $((SECONDS - t0)) s: $text"
        else
            bad "mpirun $name: exit $rc"; grep -E "mgc|Exit code" "$tmp/mpi.out" | head -4 | sed 's/^/    /'
        fi
    }
    disagree epochs "--epochs differs (rank 0: 1; rank 1: 2)" "$MGC" $L $A :: "$MGC" $L $A --epochs 2
    disagree classes "--set differs (rank 0: none; rank 1: classes=12)" "$MGC" $L $A :: "$MGC" $L $A --set classes=12
    disagree batch "--batch-size differs (rank 0: 256; rank 1: 128)" "$MGC" $L $A :: "$MGC" $L $A --batch-size 128
    disagree seed "--seed differs (rank 0: 0; rank 1: 7)" "$MGC" $L $A :: "$MGC" $L $A --seed 7
    disagree lr "--lr differs (rank 0: 0.100000001; rank 1: 0.0500000007)" "$MGC" $L $A :: "$MGC" $L $A --lr 0.05
    disagree net "the net's text differs" "$MGC" $L $A :: "$MGC" "$tmp/lenet2.net" $A
    [ -n "${MGC_DATA:-}" ] && disagree data "the data (--data, MGC_DATA) differs (rank 0: train-images 60000x28x28" "$MGC" $L $A :: "$MGC" $L $A --data "$tmp/nodata"
    # two copies of a CIFAR-10 set one pixel apart: the probe's CRC-32 of the batches tells them apart
    /usr/bin/python3 -c "
import os, sys
d = os.path.join(sys.argv[1], 'ca', 'cifar-10-batches-bin'); os.makedirs(d)
for k, name in enumerate(['data_batch_%d' % i for i in range(1, 6)] + ['test_batch']):
    open(os.path.join(d, name + '.bin'), 'wb').write(b''.join(bytes([(k + i) % 10]) + bytes(3072) for i in range(10)))" "$tmp"
    cp -r "$tmp/ca" "$tmp/cb"
    printf '\x01' | dd of="$tmp/cb/cifar-10-batches-bin/data_batch_2.bin" bs=1 seek=100 conv=notrunc status=none
    C="--set in_channels=3 --resize 28 $A"
    disagree cifar "the data (--data, MGC_DATA) differs (rank 0: CIFAR-10: data_batch_1.bin 30730 bytes crc" "$MGC" $L $C --data "$tmp/ca" :: "$MGC" $L $C --data "$tmp/cb"
    # one byte changed in the middle of a file, where the probe before the start does not look (it
    # reads the ends of CIFAR and safetensors files, the size of plain IDX files): the digests of
    # all that was read, compared after loading, stop the ranks before they train (they trained apart)
    $PY -c "
import os, sys
for side in 'ma', 'mb':
    d = os.path.join(sys.argv[1], side, 'cifar-10-batches-bin'); os.makedirs(d)
    for k, name in enumerate(['data_batch_%d' % i for i in range(1, 6)] + ['test_batch']):
        b = bytearray(b''.join(bytes([(k + i) % 10]) + bytes((i * 7 + j) % 256 for j in range(3072)) for i in range(100)))
        if side == 'mb' and name == 'data_batch_3': b[150000] ^= 1
        open(os.path.join(d, name + '.bin'), 'wb').write(b)" "$tmp"
    disagree cifar-middle "the data's data_batch_3.bin differs (rank 0: 307,300 bytes, CRC-32" "$MGC" $L $C --data "$tmp/ma" :: "$MGC" $L $C --data "$tmp/mb"
    $PY -c "
import json, os, struct, sys
for side in 'sa', 'sb':
    os.makedirs(os.path.join(sys.argv[1], side))
    for name, n in ('train', 300), ('test', 100):
        img, lab = bytearray((i * 7) % 256 for i in range(n * 784)), bytes(i % 10 for i in range(n))
        if side == 'sb' and name == 'train': img[len(img) // 2] ^= 1
        h = {'images': {'dtype': 'U8', 'shape': [n, 28, 28], 'data_offsets': [0, len(img)]},
             'labels': {'dtype': 'U8', 'shape': [n], 'data_offsets': [len(img), len(img) + n]}}
        t = json.dumps(h).encode(); t += b' ' * (-len(t) % 8)
        open(os.path.join(sys.argv[1], side, name + '.safetensors'), 'wb').write(struct.pack('<Q', len(t)) + t + img + lab)" "$tmp"
    disagree safetensors-middle "the data's train.safetensors differs (rank 0: 235,500 bytes, CRC-32" "$MGC" $L $A --data "$tmp/sa" :: "$MGC" $L $A --data "$tmp/sb"
    if [ -n "${MGC_DATA:-}" ]; then   # Fashion-MNIST uncompressed, one label changed
        mkdir -p "$tmp/ia" "$tmp/ib"
        for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
            gunzip -c "$MGC_DATA/$f.gz" > "$tmp/ia/$f" && ln "$tmp/ia/$f" "$tmp/ib/$f"
        done
        rm "$tmp/ib/train-labels-idx1-ubyte"; cp "$tmp/ia/train-labels-idx1-ubyte" "$tmp/ib/"
        printf '\x09' | dd of="$tmp/ib/train-labels-idx1-ubyte" bs=1 seek=30000 conv=notrunc status=none
        cmp -s "$tmp/ia/train-labels-idx1-ubyte" "$tmp/ib/train-labels-idx1-ubyte" && bad "idx-label: the label changed is a 9 already"
        disagree idx-label "the data's train-labels-idx1-ubyte differs (rank 0: 60,008 bytes, CRC-32" "$MGC" $L $A --data "$tmp/ia" :: "$MGC" $L $A --data "$tmp/ib"
        rm -rf "$tmp/ia" "$tmp/ib"
    fi
    # a difference far into a long value is shown where it is (the sixth file), not cut to a text both share
    cp -r "$tmp/ca" "$tmp/cc"
    printf '\x01' | dd of="$tmp/cc/cifar-10-batches-bin/test_batch.bin" bs=1 seek=100 conv=notrunc status=none
    disagree cifar-far "the data (--data, MGC_DATA) differs (rank 0: ...test_batch.bin 30730 bytes crc" "$MGC" $L $C --data "$tmp/ca" :: "$MGC" $L $C --data "$tmp/cc"
    # values alike in all that is kept of them (1 KiB) are told apart by their digests
    long=$(printf 'a%.0s' $(seq 1100))
    disagree set-long "--set differs (rank 0: ...aaaa" "$MGC" $L $A --set "x=${long}1" :: "$MGC" $L $A --set "x=${long}2"
    disagree env "the kernels' environment (MGC_FUSE, MGC_CONV) differs (rank 0: fusion off" env MGC_FUSE=0 "$MGC" $L $A :: "$MGC" $L $A
    disagree devices "--devices (each rank's) differs (rank 0: cpu:1; rank 1: cpu:2)" "$MGC" $L $A :: "$MGC" $L $A --devices cpu:2
    # a rank given an option that makes it leave before training (it used to leave, and the other
    # waited for it forever): each is part of the agreement
    disagree leave-emit "--emit differs (rank 0: none; rank 1: kernels)" "$MGC" $L $A :: "$MGC" $L $A --emit kernels
    disagree leave-dump-kernels "--dump-kernels differs (rank 0: not given; rank 1: given)" "$MGC" $L $A :: "$MGC" $L $A --dump-kernels "$tmp/dk"
    disagree leave-dump-batch "--dump-batch differs (rank 0: not given; rank 1: given)" "$MGC" $L $A :: "$MGC" $L $A --dump-batch "$tmp/db.st"
    for opt in --version --help --list-layers --list-ops --cache-info --cache-clear; do
        disagree "leave$opt" "$opt differs (rank 0: not given; rank 1: given)" "$MGC" $L $A :: "$MGC" $L $A $opt
    done
    disagree leave-rank0 "--version differs (rank 0: given; rank 1: not given)" "$MGC" --version :: "$MGC" $L $A
    # given to every rank, they are done once: rank 0 prints what is the same everywhere, each
    # machine's first rank its own (--version, the cache); status 0
    $MPI -np 2 "$MGC" --version > "$tmp/mpi.out" 2>&1 && [ "$(grep -c "^mgc $($MGC --version | head -1 | cut -d' ' -f2)" "$tmp/mpi.out")" = 1 ] &&
        $MPI -np 2 "$MGC" $L --emit ir > "$tmp/mpi2.out" 2>&1 && [ "$(grep -c "^# net lenet" "$tmp/mpi2.out")" = 1 ] &&
        ok "mpirun, every rank given --version (or --emit ir): done once, status 0" ||
        { bad "mpirun -np 2 mgc --version, --emit ir: exit $?"; head -3 "$tmp/mpi.out" "$tmp/mpi2.out" | sed 's/^/    /'; }
    # a bad command line on one rank: it stops with status 2 before MPI starts, and mpirun ends the other
    t0=$SECONDS
    $MPI -np 1 "$MGC" $L $A : -np 1 "$MGC" $L $A --epochs x > "$tmp/mpi.out" 2>&1
    rc=$?
    [ $rc -eq 2 ] && grep -q "mgc: --epochs expects a whole number, got 'x'" "$tmp/mpi.out" &&
        ok "mpirun, a bad option on one rank: status 2 in $((SECONDS - t0)) s, the option named" ||
        { bad "mpirun, a bad option on one rank: exit $rc"; grep mgc "$tmp/mpi.out" | head -3 | sed 's/^/    /'; }
    # SIGTERM to a job script that runs mpirun, passed on to the ranks as docs/running.md shows
    # (Open MPI's mpirun, signalled itself, exits 1 whatever the ranks do): every rank stops at
    # the same step with the last epoch saved, and mpirun exits 143, as one process does
    if [ -n "${MGC_DATA:-}" ]; then
        cat > "$tmp/launch.sh" << 'EOF'
mpirun --oversubscribe -np 2 "$@" &
launcher=$!
trap 'pkill -TERM -P $launcher' TERM INT HUP   # to the ranks this machine runs, not to mpirun
status=0
while kill -0 $launcher 2> /dev/null; do wait $launcher; status=$?; done
exit $status
EOF
        bash "$tmp/launch.sh" "$MGC" $L --epochs 30 --threads 1 --save "$tmp/mpi.st" > "$tmp/mpi.out" 2>&1 &
        pid=$!
        for i in $(seq 300); do grep -q "^epoch 1/" "$tmp/mpi.out" && break; sleep 0.2; done
        kill -TERM $pid
        wait_for $pid 60
        rc=$?
        if [ $rc -eq 143 ] && grep -q "interrupted by SIGTERM during epoch" "$tmp/mpi.out" && [ ! -e "$tmp/mpi.st.tmp" ] &&
           $PY -c "import sys; sys.path.insert(0, 'tests'); import st; st.load(sys.argv[1])" "$tmp/mpi.st"; then
            ok "mpirun, SIGTERM passed on to the ranks: status 143, the last finished epoch saved whole"
        else
            bad "mpirun, SIGTERM: exit $rc"; grep -E "mgc|Exit code" "$tmp/mpi.out" | tail -3 | sed 's/^/    /'
        fi
    fi
    # the deadline: a rank that never comes to the agreement (an MPI program that is not mgc)
    # stops them all, status 2, after MGC_AGREE_SECONDS
    printf '#include <mpi.h>\n#include <unistd.h>\nint main(int argc, char **argv) { MPI_Init(&argc, &argv); sleep(50); MPI_Finalize(); return 0; }\n' > "$tmp/idle.c"
    if mpicc -o "$tmp/idle" "$tmp/idle.c" 2> /dev/null; then
        t0=$SECONDS
        MGC_AGREE_SECONDS=3 $MPI -np 1 "$MGC" $L $A : -np 1 "$tmp/idle" > "$tmp/mpi.out" 2>&1
        rc=$? took=$((SECONDS - t0))
        [ $rc -eq 2 ] && [ $took -lt 30 ] && grep -q "mgc: rank 0: not every rank came to compare how it was started within 3 s" "$tmp/mpi.out" &&
            ok "mpirun, a rank that never comes to the agreement: all stop with status 2 in $took s (MGC_AGREE_SECONDS=3)" ||
            { bad "mpirun, a rank that never comes: exit $rc in $took s"; grep mgc "$tmp/mpi.out" | head -3 | sed 's/^/    /'; }
    else
        echo "skip the agreement's deadline: mpicc cannot build an MPI program"
    fi
else
    echo "skip the rank cases: mgc built without MPI, or no mpirun"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
