#!/usr/bin/env bash
# What a session lent a GPU runs there, in one call per step (each well inside a 10-minute call):
#   benchmarks/gpu_session.sh check   check-gpu (every shipped tile configuration) + the CUDA tests
#   benchmarks/gpu_session.sh bench   attention, LayerNorm and pretraining-step benchmarks
#   benchmarks/gpu_session.sh profile the BERT-base step at 128 tokens under torch.profiler, each backend
#   benchmarks/gpu_session.sh host    host (CPU) microseconds per call of each layer of the Triton path, and of one
#                                     Triton launch: kernel[grid] against the compiled kernel launched directly
#   benchmarks/gpu_session.sh quick   the CUDA kernel tests, host overhead and the BERT-base step at 128 (after a change)
#   benchmarks/gpu_session.sh tune    the LayerNorm launch-shape sweep, LayerNorm again, attention with dropout
#   benchmarks/gpu_session.sh modernbert  ModernBERT's global and local attention (RoPE, window) vs FlexAttention, SDPA,
#                                         then ModernBERT-base's step at 1,024 and 8,192 tokens against transformers
#   benchmarks/gpu_session.sh lease   what fits a 15-minute lease in one call (~7 min; 2026-11-26's took 4.5): check-gpu
#                                     --quick, ModernBERT's attention (8,192 first) and step, the backward's tile sweep
#   benchmarks/gpu_session.sh step    the BERT-base step at 128 and 512: triton, torch, transformers, each compiled and
#                                     as CUDA graphs (6.5 min on an H200: 512's compiled runs do not fit), after
#                                     auto's per-layer timing of both backends
#   benchmarks/gpu_session.sh step512 the 512 row of `step`, compiled and CUDA-graph runs included (~5 min)
#   benchmarks/gpu_session.sh compile `finetune --compile` packed and padded (it failed packed on an H200, 2026-11-27),
#                                     and eager --kernels auto's first check on the GPU, timed (5 runs, <= 9 min)
# 2026-11-28's lease ran `compile` then `step512` in one call (8.3 min on an H200) and found and checked the compile
# fix. The next lease: `profile` (where the eager Triton step at 128 still loses to PyTorch's ops), then `host`.
# Logs and JSON go to $OUT (or ./gpu_out). The device image has torch and triton but not bertkit's small
# compiled dependencies: carry them as wheels in .whl/ (the device tool's README says how); no deepspeed needed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
# The source tree keeps kernels/ and pipelines/ at the top; installed they are bertkit.kernels / bertkit.pipelines.
[ -e bertkit/kernels ] || ln -s ../kernels bertkit/kernels
[ -e bertkit/pipelines ] || ln -s ../pipelines bertkit/pipelines
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
BERTKIT=(python3 -c "from bertkit.cli import entry; entry()")

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" \
  | tee -a "$OUT/gpu.txt"

case "${1:-check}" in
  check)
    timeout 330 "${BERTKIT[@]}" check-gpu --out "$OUT/check_gpu.json" 2>&1 | tee "$OUT/check_gpu.log"
    timeout 220 python3 -m pytest -q -p no:cacheprovider -k "not under_interpreter" tests/test_kernels_attention.py \
      tests/test_kernels_layer_norm.py tests/test_kernels_torch.py tests/test_check_gpu.py tests/test_kernel_guard.py 2>&1 | tee "$OUT/pytest_cuda.log"
    ;;
  bench)
    timeout 200 python3 benchmarks/gates/attention.py --out "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log"
    timeout 90 python3 benchmarks/gates/layer_norm.py --out "$OUT/layer_norm.json" 2>&1 | tee "$OUT/layer_norm.log"
    timeout 250 python3 benchmarks/gates/pretrain_step.py --device cuda --configs base --seq 128 512 --batch 128 \
      --precision bf16 --out "$OUT" 2>&1 | tee "$OUT/pretrain_step.log"
    ;;
  step)
    # what --kernels auto's timing sees (one layer, forward + backward, at the step's shapes), then the steps: eager
    # and transformers first, the compiled and CUDA-graph ones after; each run at most 150 s, none started after 290 s
    # on a cold machine 60 s stopped the timing after its first shape (the kernels compiling): 90
    timeout 90 python3 -c "
from bertkit.kernel_guard import KernelUse, time_backends
for seq in (128, 512):
    for varlen in (False, True):
        use = KernelUse(64, 768, 'bf16', varlen, 0.1, False, seq=seq, batch=128)
        print(f'seq {seq} {\"packed\" if varlen else \"padded\"}: ms per layer', time_backends(use, 'cuda'))
" 2>&1 | tee "$OUT/auto_timing.log"
    timeout 460 python3 benchmarks/gates/pretrain_step.py --device cuda --configs base --seq 128 512 --batch 128 \
      --precision bf16 --kernels triton torch --compile --graphs --timeout 150 --deadline 290 --out "$OUT" 2>&1 \
      | tee "$OUT/pretrain_step_compiled.log"
    ;;
  compile)
    # finetune --compile on this GPU, packed and padded, PyTorch's ops and ours; eager auto's check and its time
    timeout 540 python3 benchmarks/gates/gpu_compile_check.py --timeout 95 --out "$OUT/compile_check.json" 2>&1 \
      | grep -v "it/s" | tee "$OUT/compile_check.log"
    ;;
  step512)
    # what `step` leaves for a second call (on an H200 2026-11-27 `step` ran 387 s and stopped before 512's compiled
    # runs): 512 eager again as the same call's baseline, compiled and as CUDA graphs (~5 min)
    timeout 480 python3 benchmarks/gates/pretrain_step.py --device cuda --configs base --seq 512 --batch 128 \
      --precision bf16 --kernels triton torch --compile --graphs --timeout 150 --deadline 330 --out "$OUT" 2>&1 \
      | tee "$OUT/pretrain_step_512_compiled.log"
    ;;
  modernbert)
    timeout 300 python3 benchmarks/gates/modernbert_attention.py --out "$OUT/modernbert_attention.json" 2>&1 \
      | tee "$OUT/modernbert_attention.log"
    timeout 240 python3 benchmarks/gates/modernbert_step.py --device cuda --preset base --lengths 1024,8192 \
      --tokens 32768 --kernels triton,torch 2>&1 | tee "$OUT/modernbert_step.log"
    cp benchmarks/results/modernbert_step.json "$OUT/" 2>/dev/null
    ;;
  lease)
    timeout 150 "${BERTKIT[@]}" check-gpu --quick --no-timing --out "$OUT/check_gpu.json" 2>&1 | tee "$OUT/check_gpu.log"
    timeout 120 python3 benchmarks/gates/modernbert_attention.py --seqs 8192 1024 --out "$OUT/modernbert_attention.json" 2>&1 \
      | tee "$OUT/modernbert_attention.log"
    timeout 120 python3 benchmarks/gates/modernbert_step.py --device cuda --preset base --lengths 8192,1024 \
      --tokens 32768 --kernels triton,torch 2>&1  # its table is in the JSON: a lease brings back 8 files at most
    cp benchmarks/results/modernbert_step.json "$OUT/" 2>/dev/null
    timeout 150 python3 benchmarks/gates/attention_tiles.py --deadline 120 --out "$OUT/attention_tiles.json" 2>&1 \
      | tee "$OUT/attention_tiles.log"
    # fine-tuning under bf16 autocast on the GPU (never run there before 2026-11-26): its loss tracks fp32's
    timeout 90 python3 -m pytest -q -p no:cacheprovider -k finetuning tests/test_finetune_precision.py 2>&1 | tail -3
    ;;
  profile)
    timeout 300 python3 benchmarks/gates/pretrain_step.py --device cuda --configs base --seq 128 --batch 128 \
      --precision bf16 --steps 5 --profile "$OUT" --out "$OUT" 2>&1 | tee "$OUT/pretrain_step_profile.log"
    for f in "$OUT"/profile-*.txt; do echo "== $f"; head -28 "$f" | cut -c1-200; done
    ;;
  host)
    timeout 200 python3 benchmarks/gates/host_overhead.py --out "$OUT/host_overhead.json" 2>&1 | tee "$OUT/host_overhead.log"
    # one Triton launch the usual way against the compiled kernel launched directly: is a cached launch worth it?
    timeout 120 python3 benchmarks/gates/triton_launch.py --out "$OUT/triton_launch.json" 2>&1 | tee "$OUT/triton_launch.log"
    ;;
  quick)
    timeout 150 python3 -m pytest -q -p no:cacheprovider -k "not under_interpreter and not interpreter" \
      tests/test_kernels_attention.py tests/test_kernels_layer_norm.py tests/test_kernels_torch.py 2>&1 | tee "$OUT/pytest_cuda.log"
    timeout 100 python3 benchmarks/gates/host_overhead.py --out "$OUT/host_overhead.json" 2>&1 | tee "$OUT/host_overhead.log"
    timeout 150 python3 benchmarks/gates/pretrain_step.py --device cuda --configs base --seq 128 --batch 128 \
      --precision bf16 --out "$OUT" 2>&1 | tee "$OUT/pretrain_step.log"
    ;;
  tune)
    timeout 260 python3 benchmarks/gates/layer_norm.py --sweep --out "$OUT/layer_norm_sweep.json" 2>&1 | tee "$OUT/layer_norm_sweep.log"
    timeout 90 python3 benchmarks/gates/layer_norm.py --out "$OUT/layer_norm.json" 2>&1 | tee "$OUT/layer_norm.log"
    timeout 150 python3 benchmarks/gates/attention.py --batches 128 --seqs 128 512 --dropout 0.1 \
      --out "$OUT/attention_dropout.json" 2>&1 | tee "$OUT/attention_dropout.log"
    ;;
esac
