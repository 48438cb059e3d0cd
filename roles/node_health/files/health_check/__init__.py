"""corectl-health-check's source, one module per domain (core, gpu, fabric, nvlink, xid, memory, network, storage,
services, diagnostics, nccl, perftest, sticky) and the ordered registry with the command line (checks). Standard
library only. The role ships it as a zipapp of this package, roles/node_health/files/corectl-health-check, built by
`python3 tools/zipapps.py` (tests/unit/test_zipapps.py fails when the shipped file is not the build of the source)."""
