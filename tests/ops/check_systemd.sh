#!/usr/bin/env bash
# Checks deploy/systemd with the real systemd tools:
#  1. `systemd-analyze verify` on verifyd.service must print nothing (it exits 0 on mere
#     warnings such as unknown keys or bad values, so any output fails the test). verify also
#     requires ExecStart's binary to exist: a copy of the unit runs with /usr/bin/verifyd
#     replaced by the built verifyd ($1) or, without it, by a stub script.
#  2. `systemd-analyze security --offline=yes --threshold=$THRESHOLD` (exposure score, 0 = best,
#     10 = worst) must pass, and must fail on a bare unit (proves the threshold bites).
#  3. The unit has the directives the operations contract requires, and every ${VAR} the unit
#     uses is defined in verifyd.env.
#  4. With the verifyd binary: every --flag in ExecStart is one verifyd knows.
# Usage: check_systemd.sh [path/to/verifyd]
source "$(dirname "$0")/common.sh"
need systemd-analyze systemd
THRESHOLD=20  # systemd-analyze counts in tenths: 20 = exposure 2.0
UNIT="$REPO_ROOT/deploy/systemd/verifyd.service"
ENVFILE="$REPO_ROOT/deploy/systemd/verifyd.env"
VERIFYD_BIN="${1:-}"

if ! systemd-analyze --help 2>&1 | grep -q -- '--offline'; then
  echo "SKIP: this systemd-analyze has no --offline (systemd >= 250 needed)"
  exit 77
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ -n "$VERIFYD_BIN" ]; then
  exe="$(readlink -f "$VERIFYD_BIN")"
else
  exe="$work/verifyd"
  printf '#!/bin/sh\nexit 0\n' >"$exe"
  chmod +x "$exe"
fi
sed "s#^ExecStart=/usr/bin/verifyd #ExecStart=$exe #" "$UNIT" >"$work/verifyd.service"
grep -q "^ExecStart=$exe " "$work/verifyd.service" || fail "ExecStart=/usr/bin/verifyd not found in the unit"

# 1. verify: no output at all.
out="$(systemd-analyze verify "$work/verifyd.service" 2>&1)" || fail "systemd-analyze verify failed: $out"
[ -z "$out" ] || fail "systemd-analyze verify printed warnings:"$'\n'"$out"
# The check must be able to fail: a misspelt key has to produce output.
sed 's/^NoNewPrivileges=yes/NoNewPrivileges=yse/' "$work/verifyd.service" >"$work/broken.service"
[ -n "$(systemd-analyze verify "$work/broken.service" 2>&1)" ] ||
  fail "systemd-analyze verify did not flag a broken unit: this check is blind here"
echo "ok: systemd-analyze verify (no warnings)"

# 2. security exposure.
systemd-analyze security --offline=yes "$work/verifyd.service" | tail -n 1
systemd-analyze security --offline=yes --threshold="$THRESHOLD" "$work/verifyd.service" >/dev/null ||
  fail "exposure of verifyd.service is above $THRESHOLD/10"
printf '[Service]\nType=notify\nExecStart=%s\n' "$exe" >"$work/bare.service"
if systemd-analyze security --offline=yes --threshold="$THRESHOLD" "$work/bare.service" >/dev/null 2>&1; then
  fail "a bare unit passed the exposure threshold: this check is blind here"
fi
echo "ok: systemd-analyze security exposure <= $THRESHOLD/10"

# 3. Required directives (each must appear as an exact line).
for line in Type=notify NotifyAccess=main WatchdogSec=60s Restart=on-failure NoNewPrivileges=yes \
  ProtectSystem=strict StateDirectory=verifyd PrivateTmp=yes DevicePolicy=closed \
  "DeviceAllow=char-nvidia-frontend rw" "DeviceAllow=/dev/nvidiactl rw" \
  "DeviceAllow=/dev/nvidia-uvm rw" "EnvironmentFile=/etc/default/verifyd"; do
  grep -qxF "$line" "$UNIT" || fail "verifyd.service lacks '$line'"
done
grep -q '^RestrictAddressFamilies=' "$UNIT" || fail "verifyd.service lacks RestrictAddressFamilies="
if grep -q '^PrivateDevices=yes' "$UNIT"; then fail "PrivateDevices=yes would hide the GPUs"; fi
# TimeoutStopSec must exceed the drain budget verifyd uses (30 s by default).
stop_s="$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "$UNIT")"
if [ -z "$stop_s" ] || [ "$stop_s" -le 30 ]; then
  fail "TimeoutStopSec must be > 30s (the drain), got '$stop_s'"
fi
# shellcheck disable=SC2016  # literal ${VAR} / $VAR references in the unit
for var in $(grep -o '\${\?VERIFYD_[A-Z_]*' "$UNIT" | tr -d '${' | sort -u); do
  grep -q "^$var=" "$ENVFILE" || fail "verifyd.service uses $var but verifyd.env does not set it"
done
echo "ok: required directives and environment variables"

# 4. Flags the unit passes must exist in verifyd.
if [ -n "$VERIFYD_BIN" ]; then
  help="$("$VERIFYD_BIN" --helpfull 2>&1 || true)"
  # The ExecStart= line and its continuation lines.
  execstart="$(awk '/^ExecStart=/{on=1} on{print} on && !/\\$/{on=0}' "$UNIT")"
  [ -n "$execstart" ] || fail "no ExecStart= in the unit"
  for flag in $(grep -o -- '--[a-z_]*=' <<<"$execstart" | tr -d '=' | sort -u); do
    grep -q -- "-${flag#--}" <<<"$help" || fail "verifyd does not know $flag (used in verifyd.service)"
  done
  echo "ok: every flag in ExecStart is known to $VERIFYD_BIN"
else
  echo "note: no verifyd binary given, flag names not checked"
fi
echo "PASS: systemd unit"
