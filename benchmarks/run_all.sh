#!/usr/bin/env bash
# `make bench`: every gate in benchmarks/gates/, each a quick measurement writing one JSON with its date, machine and
# commit. The GPU-only gates exit cleanly without CUDA; on a GPU machine benchmarks/gpu_session.sh runs them in steps
# that fit a 10-minute call. The studies (benchmarks/studies/, an hour or more on 2 cores) are run by hand: each
# script's docstring says how, its dated document in docs/studies/ what it found.
set -euo pipefail
cd "$(dirname "$0")/.."
for gate in benchmarks/gates/[a-z]*.py; do
  echo "== $gate"
  python "$gate"
done
