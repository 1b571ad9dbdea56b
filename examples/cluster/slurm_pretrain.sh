#!/bin/bash
# Multi-node pretraining under Slurm: one `deepspeed` launcher per node (srun, one task per node), each starting
# its node's ranks (--no_ssh --node_rank $SLURM_NODEID); the ranks meet at the allocation's first host. Submit from
# the bertkit checkout (cli.py is run from there), with the settings in the environment:
#
#   RUN=/shared/runs/p1 INSTANCES=/shared/inst128 MODEL=base sbatch --nodes 4 examples/cluster/slurm_pretrain.sh
#
# RUN must be one folder every node sees, at the same path (a shared file system): every rank writes its own
# checkpoint files there and global rank 0 writes the rest (bertkit/pretrain/README.md, "Several nodes").
# INSTANCES must be readable at the same path on every node. Whenever RUN already holds a complete checkpoint the
# run is resumed (--resume), so a requeued job (preempted, a node failed, `scontrol requeue`) continues exactly.
#SBATCH --job-name=bertkit-pretrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -euo pipefail

cd "${BERTKIT_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}"
RUN=$(realpath -m "${RUN:-runs/pretrain}")
INSTANCES=$(realpath -m "${INSTANCES:-instances}")
MODEL=${MODEL:-base}
MAX_STEPS=${MAX_STEPS:-7038}
MICRO_BATCH=${MICRO_BATCH:-64}
GLOBAL_BATCH=${GLOBAL_BATCH:-8192}
LR=${LR:-6e-3}
PRETRAIN_ARGS=${PRETRAIN_ARGS:---warmup 0.2843 --schedule poly --save-every 500 --no-progress}
export GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}         # ranks per node
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( ${SLURM_CPUS_ON_NODE:-$GPUS_PER_NODE} / GPUS_PER_NODE ))}
MASTER_PORT=${MASTER_PORT:-$(( 20000 + ${SLURM_JOB_ID:-0} % 20000 ))}  # the same on every node: one per job

export NODES
NODES=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr '\n' ' ')
MASTER_ADDR=${NODES%% *}

mkdir -p "$RUN"
# A requeued job's earlier run is dead (Slurm requeues only once its processes are gone), but its rank 0 may have run
# on a node this allocation lacks, where bertkit cannot see that the lock it left is stale: drop the lock when this
# very job (same job id) was the last to start in RUN. Any other holder still stops the run, naming itself.
if [[ -f "$RUN/.slurm_job_id" && "$(cat "$RUN/.slurm_job_id")" == "${SLURM_JOB_ID:-}" ]]; then
    rm -f "$RUN/.bertkit.lock"
fi
echo "${SLURM_JOB_ID:-}" > "$RUN/.slurm_job_id"

RESUME=
if compgen -G "$RUN/checkpoints/global_step*/checkpoint.json" > /dev/null; then
    RESUME=--resume
    echo "resuming $RUN (restart ${SLURM_RESTART_COUNT:-0} of job ${SLURM_JOB_ID:-})"
fi

# On each node: the hostfile DeepSpeed wants (every node in node-rank order, written to that node's /tmp), then the
# node's launcher. Its local ranks count from 0 on every node; global ranks follow the hostfile's order.
per_node='hostfile=$(mktemp) && printf "%s slots=$GPUS_PER_NODE\n" $NODES > "$hostfile" &&
exec deepspeed --hostfile "$hostfile" --no_ssh --node_rank "$SLURM_NODEID" "$@"'
# shellcheck disable=SC2086  # RESUME and PRETRAIN_ARGS are lists of flags
srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "$per_node" bash \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    cli.py pretrain --instances "$INSTANCES" --out "$RUN" --model "$MODEL" --max-steps "$MAX_STEPS" \
    --micro-batch "$MICRO_BATCH" --global-batch "$GLOBAL_BATCH" --lr "$LR" $RESUME $PRETRAIN_ARGS
