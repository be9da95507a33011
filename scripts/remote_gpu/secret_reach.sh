#!/usr/bin/env bash
# Can a real rank process reach the parent's secrets? Starts a 2-rank `symm` evaluation with probe keys in the
# parent's environment and, while the ranks are alive, greps every /proc/<pid>/environ a rank can see (from
# inside its PID namespace) for the probe values; prints the listening sockets; then the evaluation's result.
#   OUT=results/ scripts/remote_gpu/secret_reach.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
set -a; . cuco_kit/evaluate/multicast_off.env; set +a  # multicast off (the kit's one list)
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/secret_reach}
mkdir -p "$OUT"
export OPENAI_API_KEY=probe-openai-key AWS_SECRET_ACCESS_KEY=probe-aws-secret TORCH_HUB_TOKEN=probe-hub-token
probe='probe-openai-key|probe-aws-secret|probe-hub-token'
$PY -m cuco_kit eval sample_kernels/gemm_allgather/device_lsa.cu --workload sample_kernels/gemm_allgather \
  --ranks 2 --backend symm --size M=1024 --size N=1024 --size K=1024 --iters 200 --json >"$OUT/eval.json" \
  2>"$OUT/eval.err" &
eval_pid=$!
ranks=""
for _ in $(seq 120); do
  ranks=$(pgrep -f "[c]uco_kit.evaluate.rank.worker" | while read -r p; do pgrep -P "$p" || echo "$p"; done)
  [ -n "$ranks" ] && break
  sleep 0.5
done
sleep 3
found=0
for r in $ranks; do
  own=$(tr '\0' '\n' <"/proc/$r/environ" 2>/dev/null | grep -cE "$probe")
  # what the rank sees: every environ under its own /proc (its PID namespace and mount of /proc, if it has one);
  # the probing shell starts with an empty environment, so it adds no probe value of its own
  seen=$(env -i PATH="$PATH" nsenter -t "$r" -p -m sh -c "ls -d /proc/[0-9]* | wc -l; cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -cE '$probe'" 2>&1 | tr '\n' ' ')
  echo "rank pid $r: probe values in its own environment: $own; processes it sees, probe values among their environments: $seen"
  [ "$own" != 0 ] && found=1
  [ "$(echo "$seen" | awk '{print $2}')" != 0 ] && found=1
done
[ -z "$ranks" ] && { echo "no rank process seen"; found=2; }
ss -ltnp 2>/dev/null | grep -E "python|nsenter|unshare" | awk '{print "listening:", $4, $6}'
wait "$eval_pid"; echo "eval rc=$?"
$PY - "$OUT/eval.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:  # the eval printed no JSON: its stderr says why
    print("no eval JSON:", exc); sys.exit(0)
p = d.get("provenance") or {}
print("verdict", d.get("verdict"), "level", d.get("level_reached"), "badge", d.get("badge"), "mps", p.get("mps"),
      "rank_isolation", p.get("rank_isolation"), "reason", (d.get("reason") or "")[:200])
PY
tail -3 "$OUT/eval.err"
echo "secret_reach: found=$found (0: no probe value reachable from a rank)"
exit $found
