#!/usr/bin/env bash
# Run HERE (a machine with flex, bison and apt) before tests/gpu/check.sh runs
# on a GPU machine that has neither a package registry nor flex and bison:
# puts into .gpu/ (git-ignored; carry it) the generated parser and lexer, the
# Debian packages of OpenBLAS and zlib's headers, and Fashion-MNIST.
#   bash tests/gpu/prepare.sh        then, there:   bash tests/gpu/check.sh
set -eu
cd "$(dirname "$0")/../.."
DATA=${MGC_DATA:-../shared/data/fashion-mnist}
mkdir -p .gpu/gen .gpu/debs .gpu/data
make -s build/parser.tab.c build/lexer.c
cp build/parser.tab.c build/parser.tab.h build/lexer.c .gpu/gen/
( cd .gpu/debs && rm -f ./*.deb &&
  apt-get download libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0 zlib1g-dev 2>&1 |
  grep -v "^W: Download is performed unsandboxed" || true )
cp "$DATA"/*-ubyte.gz .gpu/data/
du -sh .gpu
echo "carry .gpu, then run: bash tests/gpu/check.sh (or a phase a command: --phase check,lenet / ref / resnet)"
