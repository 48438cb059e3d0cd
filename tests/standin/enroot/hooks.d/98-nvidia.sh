#! /bin/bash
# Stand-in for enroot's NVIDIA hook: the real one calls nvidia-container-cli to expose GPUs in the container.
set -eu
if [ -z "${NVIDIA_VISIBLE_DEVICES-}" ] || [ "${NVIDIA_VISIBLE_DEVICES}" = "void" ]; then
    exit 0
fi
echo "enroot stand-in: would expose GPUs ${NVIDIA_VISIBLE_DEVICES} to the container" >&2
exit 0
