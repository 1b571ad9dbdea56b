#!/usr/bin/env bash
# The three data stages on a Ray cluster made of this Slurm allocation's nodes:
# a Ray head on the first node, a Ray worker on each other node (srun), then prepare-corpus, train-tokenizer and
# make-instances with --engine ray, then ray stop. Input and output must be on a file system every node mounts
# (NFS, Lustre, GPFS; a bucket through s3fs, or Mountpoint for Amazon S3 for INPUT only: it cannot rename files),
# not s3:// URLs.
#
#   sbatch --nodes 8 --ntasks-per-node 1 --cpus-per-task 32 --time 12:00:00 \
#       --export ALL,INPUT=/shared/wiki,OUT=/shared/bert examples/cluster/slurm_data_stages.sh
#
# Every node needs the same Python environment with bertkit[ray] installed (a shared venv is simplest). Settings
# come from the environment (defaults in brackets):
#   INPUT             raw text: files, folders or globs (space-separated), as prepare-corpus takes them
#   OUT               shared folder for corpus/, tokenizer/, instances/ (both required)
#   VOCAB_SIZE [30522]  SAMPLE_BYTES [all the text]  SHARD_SIZE [64MB]  MAX_SEQ_LENGTH [128]  DUPE [10]
#   RAY_PORT [6379]   RAY_HEAD_IP [the first node's address]   RAY_TEMP_DIR [Ray's, /tmp/ray]
#   RAY_START_ARGS    extra `ray start` arguments for every node; RAY_HEAD_ARGS for the head only
# A stage that stops (a node lost for good, the time limit) is resumed by submitting the same job again.
#SBATCH --job-name=bertkit-data
#SBATCH --ntasks-per-node=1
set -euo pipefail

: "${INPUT:?set INPUT to the raw text (files, folders or globs on the shared file system)}"
: "${OUT:?set OUT to a shared output folder}"
VOCAB_SIZE=${VOCAB_SIZE:-30522}
SHARD_SIZE=${SHARD_SIZE:-64MB}
MAX_SEQ_LENGTH=${MAX_SEQ_LENGTH:-128}
DUPE=${DUPE:-10}
RAY_PORT=${RAY_PORT:-6379}
CPUS=${SLURM_CPUS_PER_TASK:-$(nproc)}
read -r -a START_ARGS <<< "${RAY_START_ARGS:-}"
read -r -a HEAD_ARGS <<< "${RAY_HEAD_ARGS:-}"
if [[ -n "${RAY_TEMP_DIR:-}" ]]; then HEAD_ARGS+=(--temp-dir "$RAY_TEMP_DIR"); fi

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${nodes[0]}
head_ip=${RAY_HEAD_IP:-$(getent ahostsv4 "$head_node" | awk 'NR == 1 { print $1 }')}
address="$head_ip:$RAY_PORT"
echo "Ray head on $head_node ($address), ${#nodes[@]} node(s), $CPUS CPU(s) each"

stop_ray() {   # on every node, also when a stage fails; then wait for the srun steps to end
  srun --overlap --nodes "${#nodes[@]}" --ntasks "${#nodes[@]}" --ntasks-per-node 1 ray stop --force \
    > /dev/null 2>&1 || true
  wait
}
trap stop_ray EXIT

# --block keeps each `ray start` in the foreground of its srun step, so Slurm tracks (and finally ends) it
srun --nodes 1 --ntasks 1 -w "$head_node" ray start --head --node-ip-address "$head_ip" --port "$RAY_PORT" \
  --num-cpus "$CPUS" "${START_ARGS[@]}" "${HEAD_ARGS[@]}" --block &
for _ in $(seq 120); do ray status --address "$address" > /dev/null 2>&1 && break; sleep 1; done
for node in "${nodes[@]:1}"; do
  srun --nodes 1 --ntasks 1 -w "$node" ray start --address "$address" --num-cpus "$CPUS" "${START_ARGS[@]}" \
    --block &
done
python - "$address" "${#nodes[@]}" <<'PY'
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="WARNING", log_to_driver=False)
for _ in range(300):  # every node joined, or give up after 5 minutes (the stages would run on fewer)
    if sum(n["Alive"] for n in ray.nodes()) >= int(sys.argv[2]):
        break
    time.sleep(1)
print(f"Ray cluster: {sum(n['Alive'] for n in ray.nodes())} node(s), {ray.cluster_resources().get('CPU', 0):.0f} CPU(s)")
PY

ray_flags=(--engine ray --ray-address "$address" --no-progress)
bertkit prepare-corpus $INPUT --out "$OUT/corpus" --shard-size "$SHARD_SIZE" "${ray_flags[@]}"
bertkit train-tokenizer "$OUT/corpus" --out "$OUT/tokenizer" --vocab-size "$VOCAB_SIZE" \
  ${SAMPLE_BYTES:+--sample-bytes "$SAMPLE_BYTES"} "${ray_flags[@]}"
bertkit make-instances "$OUT/corpus" --tokenizer "$OUT/tokenizer" --out "$OUT/instances" \
  --max-seq-length "$MAX_SEQ_LENGTH" --dupe "$DUPE" "${ray_flags[@]}"
echo "done: $OUT/corpus, $OUT/tokenizer, $OUT/instances"
