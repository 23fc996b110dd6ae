#!/usr/bin/env bash
# Checks deploy/prometheus with the real promtool: the scrape config, the rules, and the rule
# unit tests (verifyd-rules.test.yml).
source "$(dirname "$0")/common.sh"
need promtool prometheus
cd "$REPO_ROOT/deploy/prometheus"
promtool check config prometheus.yml
promtool check rules verifyd-rules.yml
promtool test rules verifyd-rules.test.yml
# Every alert has a runbook annotation pointing at a heading of docs/OPERATIONS.md.
alerts=$(sed -n 's/^ *- alert: *//p' verifyd-rules.yml)
[ -n "$alerts" ] || fail "no alerts in verifyd-rules.yml"
for alert in $alerts; do
  anchor="$(tr '[:upper:]' '[:lower:]' <<<"$alert")"
  grep -q "runbook: \"docs/OPERATIONS.md#$anchor\"" verifyd-rules.yml ||
    fail "alert $alert has no runbook annotation docs/OPERATIONS.md#$anchor"
  grep -qx "### $alert" "$REPO_ROOT/docs/OPERATIONS.md" ||
    fail "docs/OPERATIONS.md has no '### $alert' section (the alert's runbook)"
done
echo "ok: $(wc -w <<<"$alerts") alerts have runbook sections in docs/OPERATIONS.md"
echo "PASS: prometheus config, rules and rule unit tests"
