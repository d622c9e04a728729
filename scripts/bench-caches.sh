#!/usr/bin/env bash
# Does vLLM's CPU build compile anything without --enforce-eager, and what
# does a warm, delivered compile cache save at the start? One node, the
# tiny Llama (scripts/tiny_llama.py), vLLM from scripts/engines.sh.
#
# Rounds are interleaved: cold (an empty VLLM_CACHE_ROOT), then warm (a
# fresh folder holding a byte copy of the cache an earlier cold start
# left, as `[launch] caches` delivers it), and eager (--enforce-eager, the
# tests' setting) for reference; then again on the cold start's own folder
# (a node's own warm cache, to compare the delivered copy with). Each start is timed from the process
# start to the first completion answered.
#
# usage: scripts/bench-caches.sh [ROUNDS]   (default 2)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
rounds="${1:-2}"
py="${XFER_ENGINES_PYTHON:-$("$here/engines.sh" python)}"
venv="$(dirname "$(dirname "$py")")"
work="${XFER_BENCH_DIR:-/var/tmp/xfer-bench-caches}"
mkdir -p "$work"
"$py" "$here/tiny_llama.py" "$work/tiny" >/dev/null
port=18431
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1

# start MODE CACHE_ROOT: prints seconds to the first completion.
start() {
  local mode="$1" cache="$2" extra=() t0 pid
  [ "$mode" = eager ] && extra=(--enforce-eager)
  rm -rf "$work/inductor-tmp" && mkdir -p "$work/inductor-tmp"
  t0=$(date +%s.%N)
  VLLM_CACHE_ROOT="$cache" TORCHINDUCTOR_CACHE_DIR="$work/inductor-tmp" \
    "$venv/bin/vllm" serve "$work/tiny" --port "$port" --dtype float32 \
    --max-model-len 256 "${extra[@]}" >"$work/$mode.log" 2>&1 &
  pid=$!
  until curl -sf -o /dev/null "http://127.0.0.1:$port/health"; do
    kill -0 "$pid" 2>/dev/null || { echo "vllm died; see $work/$mode.log" >&2; exit 1; }
    sleep 0.2
  done
  curl -sf -o /dev/null "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\": \"$work/tiny\", \"prompt\": \"the quick\", \"max_tokens\": 4}"
  echo "$(date +%s.%N) - $t0" | bc
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
}

printf '%-6s %-6s %8s %10s %s\n' round mode start_s cache_files note
for r in $(seq 1 "$rounds"); do
  rm -rf "$work/cold-$r" "$work/warm-$r"
  s=$(start cold "$work/cold-$r")
  n=$(find "$work/cold-$r" -type f | wc -l)
  c=$(grep -o "init engine.*took [0-9.]* s" "$work/cold.log" | grep -o "[0-9.]* s$" || true)
  printf '%-6s %-6s %8.1f %10s %s\n' "$r" cold "$s" "$n" "init engine $c"
  cp -a "$work/cold-$r" "$work/warm-$r.src"
  # What a node receives: the files, byte for byte, in another folder.
  mkdir -p "$work/warm-$r" && cp -r "$work/warm-$r.src/." "$work/warm-$r/" && rm -rf "$work/warm-$r.src"
  s=$(start warm "$work/warm-$r")
  c=$(grep -c -i -E "load failure" "$work/warm.log" || true)
  printf '%-6s %-6s %8.1f %10s %s\n' "$r" warm "$s" "$(find "$work/warm-$r" -type f | wc -l)" "$c AOT load failure(s)"
  s=$(start again "$work/cold-$r")
  c=$(grep -c -i -E "load failure" "$work/again.log" || true)
  printf '%-6s %-6s %8.1f %10s %s\n' "$r" again "$s" "$(find "$work/cold-$r" -type f | wc -l)" "$c AOT load failure(s)"
  rm -rf "$work/eager-$r"
  s=$(start eager "$work/eager-$r")
  printf '%-6s %-6s %8.1f %10s\n' "$r" eager "$s" "$(find "$work/eager-$r" -type f 2>/dev/null | wc -l)"
done
du -sh "$work/cold-1" | sed 's/^/cache size: /'
