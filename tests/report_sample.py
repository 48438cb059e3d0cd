"""A day's report made from fixed data, with figures known by hand: the accounting (sacct's answer), the
utilisation (Prometheus's query_range answer) and the nodes out of service (unit and screenshot tests)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from corectl.health.reliability import Outage, Reliability, reliability
from corectl.health.usage import UsageRead, parse_query_range, parse_sacct, usage

SINCE = datetime(2026, 11, 1, tzinfo=UTC)
UNTIL = SINCE + timedelta(days=1)
HOSTILE = "<script>alert(1)</script>"
# JobID|User|Account|AllocTRES|ElapsedRaw|State, as sacct -X -n -P prints them
SACCT = "\n".join(
    [
        "101|alice|vision|billing=4,cpu=2,gres/gpu=4,mem=64M,node=1|36000|COMPLETED",  # 40 GPU-hours
        "102|alice|research|billing=1,cpu=1,gres/gpu=1,gres/gpu:h100=1,node=1|7200|FAILED",  # 2
        f"103|{HOSTILE}|hpcadmin|cpu=1,gres/gpu=2,node=1|9000|RUNNING",  # 5
        "104|carol|hpcadmin|cpu=1,node=1|3600|CANCELLED by 20003",  # no GPU
        "105|carol|hpcadmin||0|PENDING",  # never ran: not counted
    ]
)
TIMES = list(range(int(SINCE.timestamp()), int(UNTIL.timestamp()), 432))  # 200 steps
QUERY_RANGE = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [
            {
                "metric": {"series": "util"},
                "values": [[t, str(50 + 40 * ((i // 50) % 2))] for i, t in enumerate(TIMES)],
            },
            {"metric": {"series": "busy"}, "values": [[t, "4"] for t in TIMES[:100]]},
            {"metric": {"series": "gpus"}, "values": [[t, "16"] for t in TIMES]},
        ],
    },
}
OUTAGES = [
    Outage("dgx01", SINCE + timedelta(hours=2), SINCE + timedelta(hours=8), False, "xid", "corectl-health: xid: 79"),
    Outage("dgx02", SINCE + timedelta(hours=12), UNTIL, True, "slurm: Not responding", "Not responding"),
]


def sample_read() -> UsageRead:
    return UsageRead(usage(parse_sacct(SACCT)), parse_query_range(json.dumps(QUERY_RANGE)))


def sample_figures() -> Reliability:
    return reliability(["dgx01", "dgx02"], {}, SINCE, UNTIL)
