#!/usr/bin/env bash
# The test command: installs everything the tests need (a .venv with the dev extra; Debian's Chromium for the
# browser tier), then runs the tiers one by one, each under its budget, and names each with its count and time.
# The gpu tier runs only where `nvidia-smi -L` lists a GPU.
#   scripts/test.sh             all tiers
#   scripts/test.sh unit        one tier (unit, compile, notebook, browser, gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh dev || { echo "set-up failed"; exit 1; }

if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "note: could not install Debian's chromium; the browser tier will fail"
fi

export PATH="$PWD/.venv/bin:$PATH"
# Multicast stays off for anything these tests start on a GPU machine.
set -a; . cuco_kit/evaluate/multicast_off.env; set +a  # multicast off (the kit's one list)
mkdir -p test-artifacts

# tier:budget-seconds:per-test-timeout
tiers=("unit:300:60" "compile:900:300" "notebook:600:300" "browser:480:400" "gpu:1800:600")
only="${1:-}"
status=0
summary=()
for spec in "${tiers[@]}"; do
  IFS=: read -r tier budget per_test <<<"$spec"
  [ -n "$only" ] && [ "$only" != "$tier" ] && continue
  if [ "$tier" = gpu ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu tier not run: no GPU"
    summary+=("gpu: not run (no GPU)")
    continue
  fi
  echo "=== tier $tier (budget ${budget}s)"
  start=$(date +%s)
  [ "$tier" = notebook ] && export CUCO_SMOKE=1
  timeout --kill-after=10 "$budget" python -m pytest -m "$tier" --timeout="$per_test" --durations=15 \
    --junitxml="test-artifacts/$tier.xml" -q
  rc=$?
  unset CUCO_SMOKE
  secs=$(( $(date +%s) - start ))
  count=$(python - "$tier" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    r = ET.parse(f"test-artifacts/{sys.argv[1]}.xml").getroot()
    s = r if r.tag == "testsuite" else r.find("testsuite")
    print(f"{s.get('tests')} tests, {s.get('failures')} failed, {s.get('errors')} errors, {s.get('skipped')} skipped")
except Exception:
    print("no report")
PY
)
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    summary+=("$tier: OVER BUDGET (${secs}s > ${budget}s)"); status=1
  elif [ $rc = 5 ]; then
    summary+=("$tier: no tests collected (${secs}s)")
  elif [ $rc != 0 ]; then
    summary+=("$tier: FAILED, $count, ${secs}s"); status=1
  else
    summary+=("$tier: passed, $count, ${secs}s")
  fi
done
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $status
