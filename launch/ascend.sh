#!/bin/bash
# mm-train on several Ascend NPU nodes (HCCL): run this script once on every node, with the same
# MASTER_ADDR (an address of the first node that the others reach) and NNODES. All nodes meet at
# one c10d rendezvous on MASTER_ADDR:MASTER_PORT, which numbers them in the order they join.
# Checkpoints go to training.save, which every node must see (shared storage).
#
#   MASTER_ADDR=10.0.0.1 NNODES=2 bash launch/ascend.sh --config my_run.yaml   # on each of the 2 nodes
#
# Settings (environment): MASTER_ADDR and NNODES are required;
#   MASTER_PORT        rendezvous port (default 29500)
#   NPROC_PER_NODE     NPUs per node (default 8)
#   TRAIN_MODULE       python module to run (mm_trainer; wan22_train, ltx2_train, qwen_vl_train)
#   ASCEND_TOOLKIT_HOME  CANN toolkit whose set_env.sh is sourced (default: the standard install path)
#   HCCL_SOCKET_IFNAME network interface(s) for HCCL's sockets (and gloo's), e.g. eth0; or
#   HCCL_IF_IP         this node's address for HCCL's first connections (unset: HCCL picks one)
# training.device may stay unset: it picks npu where torch_npu is installed.
#
# Exit code (mm_trainer.run.torchrun, which passes a stopped run's code on where plain torchrun says
# 1): 0 finished; 75 (EXIT_INCOMPLETE) stopped before training.train_iters after saving (SIGTERM /
# SIGINT to this script or a rank): resume it, e.g. run the script again; anything else failed.

set -euo pipefail

: "${MASTER_ADDR:?set MASTER_ADDR to an address of node 0}"
: "${NNODES:?set NNODES to the number of nodes}"

toolkit=${ASCEND_TOOLKIT_HOME:-/usr/local/Ascend/ascend-toolkit/latest}
if [[ -f "$toolkit/set_env.sh" ]]; then
    # shellcheck source=/dev/null
    source "$toolkit/set_env.sh"
fi

# HCCL: link setup and collective timeouts (seconds), the network interface for its sockets.
# HCCL_EXEC_TIMEOUT stays below training.collective_timeout_s (default 600) so that HCCL reports the
# failing collective first; long waits (staging, conversion, async saves) are bounded by
# training.long_wait_timeout_s on a gloo group of their own, not by these.
export HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-1200}
export HCCL_EXEC_TIMEOUT=${HCCL_EXEC_TIMEOUT:-540}
if [[ -n "${HCCL_SOCKET_IFNAME:-}" ]]; then
    export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$HCCL_SOCKET_IFNAME}
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

exec python -m mm_trainer.run.torchrun \
    --nnodes "$NNODES" \
    --nproc-per-node "${NPROC_PER_NODE:-8}" \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}" \
    --rdzv-id "mm-train-$MASTER_ADDR" \
    -m "${TRAIN_MODULE:-mm_trainer}" "$@"
