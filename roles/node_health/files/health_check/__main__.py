"""corectl-health-check: is this compute node fit to run jobs? (installed by the role node_health)

Reads /etc/corectl/health.json (thresholds and expectations, written by the role) and runs the
checks below in order, the most specific first: a lost GPU is reported as gpu-count, never as the
ecc or xid failures it also causes. Each check passes, fails or is skipped, with a one-line message; a
passing check that could not look at everything says so in its message ("warning: ...") without failing.

  corectl-health-check                 one line per check, for people
  corectl-health-check --json          {"node", "ok", "checks": [{"name", "status", "message"}]}
  corectl-health-check --slurm         "<check>: <message>" of the first failure (for Slurm's
                                       HealthCheckProgram, through /etc/corectl/health.d/10-corectl)
  --config FILE  --level N (dcgmi diag level, 0 = off)  --only a,b  --check-config
  --drain-as PREFIX                    on a failure drain the node, reason "PREFIX: <check>: <message>"
                                       (corectl's validation jobs); a check whose command was stopped by a
                                       signal (the job was preempted) is "interrupted" and drains nothing
  --note-job                           write the verdict into this Slurm job's AdminComment (a pair's job:
                                       the controller reads it there)
The nccl check (nccl-tests' all_reduce_perf on every GPU) and nccl-pair (the same over the fabric, between the two
nodes of a Slurm job) run only when --only names them, or with
--validation (every check: corectl heal's validation of a drained node after a reboot or power cycle).
  corectl-health-check --list [--json]  the checks in order ([--json]: the manifest: each check's
                                       settings, every setting's type and default)
  corectl-health-check --clear-sticky BY [--json]  end the failures kept on this node (a hardware
                                       Xid, a lost GPU: kept through reboots and after the log window)
                                       and print them; BY says who (corectl heal, corectl resume)

Exit status: 0 all checks pass or are skipped, 1 a check failed or was interrupted, 2 bad configuration or usage;
with --slurm, 3 when the first failure is one the node keeps (a hardware failure, kept until corectl heal or corectl
resume ends it): Slurm's health program then also requeues the node's batch jobs, where the site asks for it.
Stdlib only (Python 3.10+); every command runs with a timeout. The same script runs against the
stand-in tools of the tests and against real nvidia-smi, nv-fabricmanager, dcgmi and sysfs.
"""

from __future__ import annotations

import signal
import sys

from .checks import main

signal.signal(signal.SIGPIPE, signal.SIG_DFL)
sys.exit(main())
