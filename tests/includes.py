#!/usr/bin/env python3
"""No two files of a folder need each other.

Inside each source folder, file a.c needs file b.c when a's object uses a
function or global that b's defines (nm of make's objects); each file's
header declares what it gives the others, so a circle of such needs is a
circle of includes: files that can be read, changed or tested only
together. Prints each folder's result, and for a circle the files and what
each takes from the next; "N passed, M failed".

Known circles, not yet broken, are listed in KNOWN (none now): a folder whose circle is
exactly the one listed passes with a note, any other circle fails.
usage: tests/includes.py [BUILD_DIR]   (default build)
"""
import glob
import os
import subprocess
import sys

FOLDERS = ['ir', 'frontend', 'codegen', 'pipeline', 'runtime', 'data', 'train', 'export', 'driver']
KNOWN = {
}
build = sys.argv[1] if len(sys.argv) > 1 else 'build'
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
passed = failed = 0


def circles(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            c = set()
            while True:
                w = stack.pop()
                on.discard(w)
                c.add(w)
                if w == v:
                    break
            if len(c) > 1:
                found.append(c)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


for folder in FOLDERS:
    files = sorted(os.path.basename(p)[:-2] for p in glob.glob(f'{folder}/*.c'))
    defined, used, missing = {}, {}, []
    for f in files:
        obj = f'{build}/{folder}/{f}.o'
        if not os.path.exists(obj):
            missing.append(obj)
            continue
        used[f] = set()
        for line in subprocess.run(['nm', obj], capture_output=True, text=True, check=True).stdout.splitlines():
            p = line.split()
            if len(p) == 2 and p[0] == 'U':
                used[f].add(p[1])
            elif len(p) == 3 and p[1] in 'TDBRG':
                defined[p[2]] = f
    if missing:
        failed += 1
        print(f'FAIL {folder}/: not built: {" ".join(missing)} (make first)')
        continue
    needs = {f: {defined[s] for s in used[f] if s in defined and defined[s] != f} for f in used}
    found = circles(needs)
    bad = [c for c in found if c != KNOWN.get(folder)]
    if folder in KNOWN and KNOWN[folder] not in found:
        failed += 1
        print(f'FAIL {folder}/: the known circle ({", ".join(sorted(KNOWN[folder]))}) is not there as listed: '
              'take it out of KNOWN in tests/includes.py, or list what it is now')
    elif bad:
        failed += 1
        for c in bad:
            print(f'FAIL {folder}/: a circle of {len(c)} files:')
            for a in sorted(c):
                for b in sorted(needs[a] & c):
                    takes = sorted(s for s in used[a] if defined.get(s) == b)
                    print(f'    {a}.c needs {b}.c: {" ".join(takes[:6])}{" ..." if len(takes) > 6 else ""}')
    elif folder in KNOWN:
        passed += 1
        print(f'note {folder}/: {len(files)} files, the known circle of {len(KNOWN[folder])}: {", ".join(sorted(KNOWN[folder]))}')
    else:
        passed += 1
        print(f'ok   {folder}/: {len(files)} files, none needs a file that needs it')
print(f'{passed} passed, {failed} failed')
sys.exit(1 if failed else 0)
