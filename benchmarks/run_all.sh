#!/usr/bin/env bash
# CPU benchmarks (`make bench`). GPU ones (attention, layer_norm, host_overhead, pretrain_step on CUDA) exit cleanly
# without CUDA; on a GPU machine, benchmarks/gpu_session.sh runs them in steps that fit a 10-minute call.
# Not here, the studies (an hour or more on 2 cores, run by hand; each script's docstring says how, its results
# document says what it found): pretrain_transfer.py, recipes.py, korean_vocab.py, korean_transfer.py, budget.py
# (with budget_peer.py, transformers' run_mlm.py arm), stress_exit.py, scale.py (hours at 4 GB: results/scale.md),
# tokenizer_sample.py (half an hour: results/scale.md), reference_training.py (it needs pretrain_transfer.py's
# instances), cpu_bf16.py and cpu_bf16_quality.py (any instances), threads.py, finetune_parity.py (with
# finetune_peer.py, transformers' side), finetune_lockstep.py, finetune_memory.py, embedding_parity.py
# (sentence-transformers' trainer beside finetune embed), korean_embeddings.py, walkthrough_times.py (README.ko.md's
# walk-throughs as written, timed), data_quality.py (the data-quality steps on a planted corpus, beside datatrove),
# cleaning_pays.py (pretraining on a dirty and a cleaned crawl at one budget), vocab_extension.py (all-MiniLM-L6-v2
# continued on Korean with and without extend-vocab). record.py: what every result records, benchlib.py: what the
# studies share (issue 84: a study imports these two, never another study).
set -euo pipefail
cd "$(dirname "$0")/.."
for b in prepare_corpus sentence_splitters korean_splitters make_instances scale_out pretrain_step cpu_backends optimizer_step \
    kernel_resources host_time_cpu attention layer_norm host_overhead; do
  if [ -f "benchmarks/$b.py" ]; then
    echo "== benchmarks/$b.py"
    python "benchmarks/$b.py"
  fi
done
