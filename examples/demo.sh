#!/usr/bin/env bash
# End-to-end demo of every stage on an embedded corpus (no download). Run by `make demo`.
# Corpus: Python's own documentation (pydoc_data.topics) plus Korean paragraphs written for this project.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${DEMO_OUT:-demo_out}
STEPS=${DEMO_STEPS:-300}
rm -rf "$OUT"
mkdir -p "$OUT"
step() { printf '\n== %s\n' "$*"; }

step "1. embedded raw text"
python examples/make_demo_corpus.py "$OUT/raw"

step "2. prepare-corpus: clean, sentence-split, deduplicate into Arrow shards"
bertkit prepare-corpus "$OUT/raw" --out "$OUT/corpus"

step "3. train-tokenizer: WordPiece on the corpus"
bertkit train-tokenizer "$OUT/corpus" --out "$OUT/tokenizer" --vocab-size 4000

step "4. make-instances: MLM+NSP pairs (dynamic: masked in the training loader)"
bertkit make-instances "$OUT/corpus" --tokenizer "$OUT/tokenizer" --out "$OUT/instances" \
    --max-seq-length 64 --mode dynamic

step "5. pretrain a tiny BERT with DeepSpeed (2 CPU ranks, gloo), then export to the HF format"
# One thread per rank: two ranks already fill this demo's two-core target machine.
OMP_NUM_THREADS=1 deepspeed --num_gpus 2 cli.py pretrain --instances "$OUT/instances" --model tiny \
    --out "$OUT/run" --max-steps "$STEPS" --micro-batch 16 --optimizer adamw --lr 1e-3 --warmup 0.05 \
    --log-every 50 --save-every 100 --eval-every 100
bertkit export "$OUT/run" --out "$OUT/model"
bertkit report "$OUT/run" --out "$OUT/run/report.html"   # curves, instance statistics, settings: one HTML page

step "6. fill-mask on the exported model"
bertkit fill-mask --model "$OUT/model" --top-k 5 "The [MASK] statement is used to leave a loop." \
    "An object is [MASK] if its value can change."

step "7. fine-tune the exported model: word order (original vs shuffled sentences) made from the corpus"
python examples/make_demo_pairs.py "$OUT/corpus" "$OUT/word_order"
bertkit finetune classify --model "$OUT/model" --train-file "$OUT/word_order/train.tsv" \
    --dev-file "$OUT/word_order/dev.tsv" --text-a sentence --label label \
    --out "$OUT/finetune" --epochs 5 --lr 5e-4 --batch-size 32 --max-seq-length 64

bertkit report "$OUT/finetune" --out "$OUT/finetune/report.html"

step "8. the same corpus and vocabulary to a ModernBERT (RoPE, GeGLU, local/global attention), MLM only"
# --recipe budget: 64-token MLM-only instances, modernbert-tiny, no dropout, AdamW 3e-3 (docs/studies/2026-11-24-budget.md);
# the export is a folder transformers' ModernBertForMaskedLM loads unchanged
bertkit make-instances "$OUT/corpus" --tokenizer "$OUT/tokenizer" --out "$OUT/instances-mlm" --recipe budget
bertkit pretrain --instances "$OUT/instances-mlm" --recipe budget --out "$OUT/run-modernbert" \
    --max-steps "$STEPS" --log-every 50 --eval-every 100
bertkit export "$OUT/run-modernbert" --out "$OUT/model-modernbert"
python -c "import sys, transformers; m = transformers.AutoModelForMaskedLM.from_pretrained(sys.argv[1]); \
print('transformers loads it:', type(m).__name__, m.config.global_attn_every_n_layers, m.config.local_attention)" \
    "$OUT/model-modernbert"
bertkit fill-mask --model "$OUT/model-modernbert" --top-k 5 "The [MASK] statement is used to leave a loop."

step "done: everything is under $OUT/ (reports: $OUT/run/report.html, $OUT/finetune/report.html; ModernBERT:
$OUT/model-modernbert;
TensorBoard: tensorboard --logdir $OUT)"
