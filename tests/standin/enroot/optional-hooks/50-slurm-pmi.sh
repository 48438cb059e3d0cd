#! /bin/bash
# Stand-in for enroot's optional Slurm PMI hook: the real one passes PMI/PMIx variables and sockets through.
set -eu
if [ -z "${SLURM_MPI_TYPE-}" ]; then
    exit 0
fi
for var in $(compgen -e | grep -E '^(PMI|PMIX|SLURM_PMI)'); do
    printf '%s=%s\n' "${var}" "${!var}" >> "${ENROOT_ENVIRON:-/dev/null}"
done
exit 0
