#!/usr/bin/env bash
# End-to-end demo of every stage on an embedded corpus (no download). Run by `make demo`.
set -euo pipefail
OUT=${DEMO_OUT:-demo_out}
mkdir -p "$OUT"
python examples/make_demo_corpus.py "$OUT/raw"
echo "== demo: stages land here as their issues do =="
