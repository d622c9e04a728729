#!/usr/bin/env bash
# What issue 30's integrity rules cost, side by side in one invocation, on
# one agent on 127.0.0.1 (release build):
#
#   update    push v2 over a complete v1 (half its files other bytes of the
#             same size: the record is marked replacing and each replaced
#             file's stamp leaves it before the rename) vs the same push
#             into an empty root, vs `rsync -a --whole-file` of v2 over a
#             copy of v1 (local, the usual way to update a model in place).
#   readback  the agent is killed (-9) once half the files are placed, then
#             restarted and the push run again: the files its journal says
#             were placed are read back and re-hashed before they count.
#             Printed beside a full push into an empty root and `b3sum` of
#             the bytes that were placed, read from disk as the agent reads
#             them (the read-back's physical floor).
#
#   scripts/bench-integrity.sh            SIZE_MB [1024] FILES [8] RUNS [3]
#
# Needs root only to install rsync/b3sum when missing.

set -euo pipefail
export LC_ALL=C
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=bench-integrity
# shellcheck source=scripts/lib-bench.sh
. "$REPO/scripts/lib-bench.sh"

SIZE_MB=${SIZE_MB:-1024}
FILES=${FILES:-8}
RUNS=${RUNS:-3}
PORT=${PORT:-17580}
RUN=$(mktemp -d /var/tmp/xfer-bench-integrity.XXXXXX)
need rsync rsync
need b3sum b3sum

cleanup() {
    local rc=$?
    set +e
    stop_all
    rm -rf "$RUN"
    exit "$rc"
}
trap cleanup EXIT

log "building xfer (release)"
(cd "$REPO" && cargo build --release -p xfer >&2)
cp "${CARGO_TARGET_DIR:-$REPO/target}/release/xfer" "$RUN/xfer"
XFER=$RUN/xfer
KEY=$RUN/cluster.key
"$XFER" keygen --out "$KEY" >/dev/null
export XDG_CACHE_HOME=$RUN/cache
unset XFER_KEY RUST_LOG

# Two versions of one model: FILES files of SIZE_MB/FILES each; v2 has other
# bytes (same sizes) in the odd-numbered files.
per=$((SIZE_MB / FILES))
for v in 1 2; do mkdir -p "$RUN/v$v/model"; done
for ((i = 0; i < FILES; i++)); do
    f=$(printf 'model-%05d.safetensors' "$i")
    head -c "${per}M" /dev/urandom >"$RUN/v1/model/$f"
    if ((i % 2)); then
        head -c "${per}M" /dev/urandom >"$RUN/v2/model/$f"
        # Written a minute later, as an update is: rsync's quick check
        # (size and mtime in whole seconds) would skip a same-size file
        # written within the same second.
        touch -d '+1 minute' "$RUN/v2/model/$f"
    else
        cp "$RUN/v1/model/$f" "$RUN/v2/model/$f"
    fi
done
warm "$RUN/v1"
warm "$RUN/v2"

AGENT_PID=
agent() { # agent ROOT
    : >"$RUN/agent.out"
    "$XFER" serve --listen "127.0.0.1:$PORT" --root "$1" --key "$KEY" >"$RUN/agent.out" 2>>"$RUN/agent.err" &
    AGENT_PID=$!
    track "$AGENT_PID"
    for _ in $(seq 150); do
        grep -q 'xfer agent listening' "$RUN/agent.out" && return 0
        sleep 0.1
    done
    die "agent did not start: $(tail -n3 "$RUN/agent.err")"
}
push() { # push SRC [EXTRA...]: seconds
    local src=$1 t0 t1
    shift
    t0=$(date +%s.%N)
    "$XFER" push "$src" --to "127.0.0.1:$PORT" --key "$KEY" --rehash --json "$@" >"$RUN/push.json" 2>>"$RUN/push.err" ||
        die "push failed: $(tail -n3 "$RUN/push.err")"
    t1=$(date +%s.%N)
    elapsed "$t0" "$t1"
}

# ------------------------------------------------------------------ update ----
over=() empty=() rs=()
for ((r = 0; r < RUNS; r++)); do
    root=$RUN/root
    fresh_dir "$root"
    agent "$root"
    push "$RUN/v1/model" >/dev/null
    sync
    over+=("$(push "$RUN/v2/model")")
    grep -q '"ok": *true' "$RUN/push.json" || die "the update did not complete"
    stop_pid "$AGENT_PID"
    fresh_dir "$root"
    agent "$root"
    sync
    empty+=("$(push "$RUN/v2/model")")
    stop_pid "$AGENT_PID"
    fresh_dir "$RUN/rsync"
    cp -a "$RUN/v1/model" "$RUN/rsync/model"
    sync
    t0=$(date +%s.%N)
    rsync -a --whole-file "$RUN/v2/model/" "$RUN/rsync/model/"
    sync
    t1=$(date +%s.%N)
    rs+=("$(elapsed "$t0" "$t1")")
done
m_over=$(median "${over[@]}")
m_empty=$(median "${empty[@]}")
m_rs=$(median "${rs[@]}")

# ---------------------------------------------------------------- readback ----
resume=() full=() b3=()
for ((r = 0; r < RUNS; r++)); do
    root=$RUN/root
    fresh_dir "$root"
    agent "$root"
    full+=("$(push "$RUN/v1/model")")
    stop_pid "$AGENT_PID"
    fresh_dir "$root"
    agent "$root"
    # Slowed so the kill lands with half the files placed.
    "$XFER" push "$RUN/v1/model" --to "127.0.0.1:$PORT" --key "$KEY" --rehash \
        --limit-rate "$((SIZE_MB / 4))MiB" >/dev/null 2>&1 &
    slow=$!
    track "$slow"
    until [ "$(find "$root/model" -type f 2>/dev/null | wc -l)" -ge $((FILES / 2)) ]; do sleep 0.05; done
    kill -9 "$AGENT_PID"
    stop_pid "$slow"
    placed=$(find "$root/model" -type f | sort)
    agent "$root"
    sync
    resume+=("$(push "$RUN/v1/model")")
    stop_pid "$AGENT_PID"
    sync
    warm "$RUN/v1"
    # The agent wrote them with O_DIRECT, so its read-back found them on
    # disk, not in the page cache: so does b3sum (each evicted first).
    for f in $placed; do dd if="$f" iflag=nocache count=0 status=none; done
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    b3sum --num-threads 1 $placed >/dev/null
    t1=$(date +%s.%N)
    b3+=("$(elapsed "$t0" "$t1")")
done
m_resume=$(median "${resume[@]}")
m_full=$(median "${full[@]}")
m_b3=$(median "${b3[@]}")

GIT_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
cat <<EOF
bench-integrity ($GIT_REV, $(nproc) cores, ${SIZE_MB} MiB in $FILES files, median of $RUNS)
update, half the files other bytes:
  xfer push v2 over complete v1     $(fmt %.2f "$m_over") s
  xfer push v2 into an empty root   $(fmt %.2f "$m_empty") s   ratio $(ratio "$m_over" "$m_empty")
  rsync --whole-file v2 over v1     $(fmt %.2f "$m_rs") s   xfer/rsync $(ratio "$m_over" "$m_rs")
resume after kill -9 of the agent with half the files placed:
  xfer push again (reads back the placed files)  $(fmt %.2f "$m_resume") s
  xfer push into an empty root                   $(fmt %.2f "$m_full") s   ratio $(ratio "$m_resume" "$m_full")
  b3sum of the placed files (1 thread)           $(fmt %.2f "$m_b3") s
EOF
