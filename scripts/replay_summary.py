#!/usr/bin/python3
"""replay_summary.py REPORT.json [...] - one line per `dsv4 replay --json` (or `dsv4 verify --json`) report:
"VERDICT FIRST RATIO", FIRST = the first locally broken layer/probe ("-" when none), RATIO = the largest RMS ratio of
candidate to baseline local error over the float probes ("-" without a baseline). The Flash-width table of
scripts/replay_on_device.sh and tests/e2e_replay*.sh read it. A missing or unreadable report prints "ERROR - -"."""
import json
import sys


def summary(path):
    try:
        r = json.load(open(path))
    except (OSError, ValueError):
        return "ERROR - -"
    d = r.get("first_divergence") or {}
    first = f"{d['layer']}/{d.get('probe', d.get('dataset', '-'))}" if "layer" in d else "-"
    ratio = None
    for p in r.get("probes", []):
        b = p.get("baseline") or {}
        q = b.get("ratio")
        if isinstance(q, (int, float)) and (ratio is None or q > ratio):
            ratio = q
    return f"{str(r.get('verdict', '?')).upper()} {first} {'-' if ratio is None else f'{ratio:.2f}'}"


for a in sys.argv[1:]:
    print(summary(a))
