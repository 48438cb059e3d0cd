#! /bin/bash
# Stand-in for enroot's optional Slurm PyTorch hook: the real one derives MASTER_ADDR, WORLD_SIZE, RANK from Slurm.
set -eu
if [ -z "${SLURM_JOB_ID-}" ] || [ -z "${PYTORCH_VERSION-}" ]; then
    exit 0
fi
{
    echo "WORLD_SIZE=${SLURM_NTASKS:-1}"
    echo "RANK=${SLURM_PROCID:-0}"
    echo "LOCAL_RANK=${SLURM_LOCALID:-0}"
} >> "${ENROOT_ENVIRON:-/dev/null}"
exit 0
