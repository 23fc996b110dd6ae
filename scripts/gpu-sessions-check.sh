#!/usr/bin/env bash
# Fork and truncate on a GPU server, checked end to end with verifyctl (run on a GPU machine
# from a bundle of verifyd + verifyctl + libverifyd_cuda_engine.so):
#   scripts/gpu-sessions-check.sh BUNDLE [model] [backend]
# 1. open a session on a fixed prompt and decode 12 tokens (empty trees: plain greedy);
# 2. fork it; 6 more tokens on the fork and 6 on the parent must be equal (same history);
# 3. truncate the parent back to prompt + 5 tokens: the new pending token and the next 6
#    tokens must equal the ones first decoded from that point.
# Every step runs alone on the server, so the GPU sees the same batch shapes both times.
# Exit 0 when every check holds; prints each sequence.
set -u
bundle=$1
model=${2:-tiny}
backend=${3:-cuda}
source "$bundle/env.sh"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
port=50071
ctl() { "$bundle/bin/verifyctl" --target=127.0.0.1:$port "$@"; }
field() { sed -n "s/^$1: //p"; }
"$bundle/bin/verifyd" --backend="$backend" --model="$model" --listen=127.0.0.1:$port \
  --metrics_listen= > /tmp/verifyd-sessions.log 2>&1 &
pid=$!
for i in $(seq 1 120); do ctl info > /dev/null 2>&1 && break; sleep 0.5; done
fail=0
decode() {  # session, n: prints the bonus tokens of n empty-tree rounds
  for _ in $(seq 1 "$2"); do ctl verify --session="$1" --tokens= --parents= | field bonus_token; done
}
prompt=$(seq -s, 3 22)  # 20 tokens
open=$(ctl open --prompt="$prompt")
s=$(echo "$open" | field session_id)
first=$(echo "$open" | field next_token)
hist=($first $(decode "$s" 12))
echo "parent: ${hist[*]}"
f=$(ctl fork --session="$s" | field session_id)
a=$(decode "$f" 6 | tr '\n' ' ')
b=$(decode "$s" 6 | tr '\n' ' ')
echo "fork:   $a"
echo "parent: $b"
[ "$a" = "$b" ] || { echo "FAIL: the fork and its parent diverged"; fail=1; }
t=$(ctl truncate --session="$s" --len=25)
pending=$(echo "$t" | field next_token)
c=$(decode "$s" 6 | tr '\n' ' ')
want="${hist[@]:6:6}"
echo "truncated to 25: pending $pending (want ${hist[5]}), then $c (want $want )"
[ "$pending" = "${hist[5]}" ] || { echo "FAIL: pending token after truncate"; fail=1; }
[ "$c" = "$want " ] || { echo "FAIL: decoding after truncate"; fail=1; }
ctl close --session="$s" > /dev/null; ctl close --session="$f" > /dev/null
kill -TERM $pid; wait $pid
[ $fail -eq 0 ] && echo "fork/truncate on $backend: OK"
exit $fail
