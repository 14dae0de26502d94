#!/usr/bin/env bash
# What the manager's ServiceAccount did in a test run, by API group,
# resource and verb, from the API servers' audit logs:
#
#   CAPTF_AUDIT_DIR=/tmp/captf-audit cargo test --workspace
#   hack/rbac-audit.sh /tmp/captf-audit
#
# Read it beside config/rbac/role.yaml: a verb the role grants that no
# test used is either dead or untested.
set -euo pipefail
dir=${1:?usage: hack/rbac-audit.sh AUDIT_DIR}
cat "$dir"/*.log | python3 -c '
import json, sys, collections
seen = collections.Counter()
for line in sys.stdin:
    try:
        e = json.loads(line)
    except ValueError:
        continue
    r = e.get("objectRef") or {}
    res = r.get("resource", "(non-resource " + e.get("requestURI", "") + ")")
    if r.get("subresource"):
        res += "/" + r["subresource"]
    code = (e.get("responseStatus") or {}).get("code", 0)
    seen[(r.get("apiGroup", ""), res, e.get("verb"), "denied" if code == 403 else "")] += 1
for (group, res, verb, denied), n in sorted(seen.items()):
    print("%-28s %-40s %-18s %8d %s" % (group or "core", res, verb, n, denied))
'
