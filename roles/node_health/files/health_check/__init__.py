"""corectl-health-check's source, one module per domain (core, gpu, fabric, nvlink, xid, network,
storage, services, diagnostics) and the ordered registry with the command line (checks). Standard
library only. The role ships it as one file, roles/node_health/files/corectl-health-check,
generated from these modules by `python3 roles/node_health/files/health_check/bundle.py`
(tests/unit/test_health_manifest.py fails when the shipped file is not the bundle of the source)."""
