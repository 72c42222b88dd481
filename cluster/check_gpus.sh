#!/bin/sh
# Refuse to start Ray on a node whose container sees fewer GPUs than the node advertises.
#
#   sh check_gpus.sh [N]     (cluster/gpu.yaml runs it before `ray start` on every worker)
#
# N: the GPUs Ray will advertise; by default the "GPU" of RAY_OVERRIDE_RESOURCES, the node type's
# `resources` that Ray's autoscaler hands the start commands. A container started without the
# NVIDIA runtime, or with a GPU lost (Xid error, driver mismatch), would otherwise join the cluster
# offering GPUs that every trial placed on it fails to use. Both the driver's view (nvidia-smi -L)
# and PyTorch's (torch.cuda.device_count()) must reach N. Exit 1, with the counts, if either falls short.
set -u

want=${1:-$(printf '%s' "${RAY_OVERRIDE_RESOURCES:-}" | sed -n 's/.*"GPU": *\([0-9][0-9]*\).*/\1/p')}
want=${want:-0}
if [ "$want" -eq 0 ]; then
    echo "check_gpus: this node advertises no GPU"
    exit 0
fi
listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
usable=$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null)
usable=${usable:-0}
if [ "$listed" -lt "$want" ] || [ "$usable" -lt "$want" ]; then
    echo "check_gpus: this node advertises GPU: $want but its container sees $listed (nvidia-smi -L)" \
         "and PyTorch $usable (torch.cuda.device_count()); Ray is not started" >&2
    exit 1
fi
echo "check_gpus: $want GPU(s) advertised, $listed seen by nvidia-smi, $usable by PyTorch"
