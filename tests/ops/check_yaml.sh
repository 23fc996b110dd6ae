#!/usr/bin/env bash
# yamllint over every YAML file in deploy/ (Prometheus, Kubernetes) with deploy/yamllint.yml.
source "$(dirname "$0")/common.sh"
need yamllint yamllint
cd "$REPO_ROOT"
files=$(find deploy -name '*.yml' -o -name '*.yaml' | sort)
[ -n "$files" ] || fail "no YAML files under deploy/"
# shellcheck disable=SC2086
yamllint --strict -c deploy/yamllint.yml $files
echo "PASS: yamllint on $(echo "$files" | wc -l) files"
