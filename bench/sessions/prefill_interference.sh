#!/usr/bin/env bash
# How much one long prefill slows every other session's Verify (chunked prefill: the
# scheduler interleaves at most one prefill chunk per engine step with the verify work).
# Runs on a GPU machine from a bundle of verifyd + verifyctl (+ libverifyd_cuda_engine.so):
#   bench/sessions/prefill_interference.sh BUNDLE OUTDIR [prompt_tokens] [layers] [chunk]
# 1. baseline: 16 sessions of `verifyctl load` (n-gram drafter) alone;
# 2. the same load started while one session prefills a prompt_tokens-long random prompt.
# Prints both load lines (p50/p90/p99 Verify latency) and the prefill time; logs in OUTDIR.
set -u
bundle=$1
out=$2
prompt=${3:-185000}
layers=${4:-8}
chunk=${5:-512}
source "$bundle/env.sh"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
ctl() { "$bundle/bin/verifyctl" --target=127.0.0.1:50061 "$@"; }
"$bundle/bin/verifyd" --backend=cuda --model=kimi-k2-attn --preset_layers="$layers" \
  --kv_slots=$((prompt + 65536)) --prefill_chunk="$chunk" --listen=127.0.0.1:50061 \
  --metrics_listen= --max_call_deadline_s=900 > "$out/verifyd.log" 2>&1 &
pid=$!
for i in $(seq 1 240); do ctl info > /dev/null 2>&1 && break; sleep 0.5; done
ctl info | head -4
ctl load --drafter=ngram --sessions=16 --rounds=100 > "$out/warmup.log" 2>&1
ctl load --drafter=ngram --sessions=16 --rounds=300 > "$out/baseline.log" 2>&1
echo "baseline: $(head -1 "$out/baseline.log")"
ctl open --random_prompt="$prompt" --timeout_s=900 > "$out/prefill.log" 2>&1 &
ppid=$!
sleep 2
ctl load --drafter=ngram --sessions=16 --rounds=300 > "$out/during.log" 2>&1
still=$(kill -0 $ppid 2> /dev/null && echo yes || echo no)
echo "during a ${prompt}-token prefill (prefill still running when the load ended: $still):"
echo "  $(head -1 "$out/during.log")"
wait $ppid
echo "prefill: $(tr '\n' ' ' < "$out/prefill.log")"
kill -TERM $pid
wait $pid
echo "verifyd exit=$?"
