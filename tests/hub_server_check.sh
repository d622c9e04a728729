#!/usr/bin/env bash
# Checks tests/hub_server.py against the real huggingface_hub client (hf CLI + python API):
#   1. `hf download` and snapshot_download() build a correct cache; --local-dir works
#   2. HF_HUB_OFFLINE=1 snapshot_download(local_files_only=True) finds the snapshot
#   3. `hf cache verify` passes on the downloaded cache and local dir, fails on a corrupted blob
#   4. gated repo (no/wrong/right token), renamed repo (relative 307), no Authorization on the CDN
# Needs network access to PyPI only if the venv is missing. Exits non-zero on the first failure.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${HF_VENV:-/var/tmp/xfer-venv-hf}"
if [ ! -x "$VENV/bin/hf" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q huggingface_hub
fi
PY="$VENV/bin/python"
HF="$VENV/bin/hf"
echo "huggingface_hub $("$PY" -c 'import huggingface_hub as h; print(h.__version__)')"

WORK="$(mktemp -d /tmp/hub_server_check.XXXXXX)"
SERVER_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; echo "--- server log tail:" >&2; tail -20 "$WORK/server.log" >&2 || true; exit 1; }
ok() { echo "ok   $*"; }

# --- a small repo: json, a subfolder, two multi-MiB safetensors, a 200 KB non-LFS file
R="$WORK/repos"
mkdir -p "$R/acme/tiny/sub" "$R/acme/gated"
echo '{"architectures": ["Tiny"], "hidden_size": 8}' > "$R/acme/tiny/config.json"
echo "hello from a subfolder" > "$R/acme/tiny/sub/readme.txt"
head -c 3000000 /dev/urandom > "$R/acme/tiny/model-00001-of-00002.safetensors"
head -c 5242881 /dev/urandom > "$R/acme/tiny/sub/model-00002-of-00002.safetensors"
head -c 200000 /dev/urandom | base64 > "$R/acme/tiny/tokenizer.json"
echo '{"gated": true}' > "$R/acme/gated/config.json"
head -c 2000000 /dev/urandom > "$R/acme/gated/model.safetensors"

mkfifo "$WORK/ready"
python3 "$HERE/hub_server.py" --repos "$R" --page-size 2 --token sekrit --gated acme/gated \
    --alias old/tiny=acme/tiny --log "$WORK/server.log" > "$WORK/ready" &
SERVER_PID=$!
read -r -t 60 WORD HUB_PORT CDN_PORT < "$WORK/ready" || fail "server did not start"
[ "$WORD" = READY ] || fail "unexpected first line: $WORD"
ok "server READY hub=$HUB_PORT cdn=$CDN_PORT"

export HF_ENDPOINT="http://127.0.0.1:$HUB_PORT" HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HOME="$WORK/hf_home"
unset HF_TOKEN HF_HUB_OFFLINE HF_HUB_ENABLE_HF_TRANSFER HUGGING_FACE_HUB_TOKEN || true
curl -sf "$HF_ENDPOINT/_repos" > "$WORK/expected.json" || fail "/_repos"
COMMIT=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["acme/tiny"]["commit"])' "$WORK/expected.json")

# check_cache CACHE_DIR REPO_ID: blobs named by etag with right content, relative symlinks, refs/main
check_cache() {
    "$PY" - "$1" "$2" "$WORK/expected.json" <<'EOF' || fail "cache check of $1 ($2)"
import hashlib, json, os, sys
cache, repo_id, expected = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))["acme/" + sys.argv[2].split("/")[1]]
base = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
ref = open(os.path.join(base, "refs", "main")).read()
assert ref == expected["commit"], f"refs/main {ref!r} != {expected['commit']}"
snap = os.path.join(base, "snapshots", ref)
for path, f in expected["files"].items():
    link = os.path.join(snap, path)
    target = os.readlink(link)
    want = "../" * (path.count("/") + 2) + "blobs/" + f["etag"]
    assert target == want, f"{path}: symlink {target} != {want}"
    data = open(link, "rb").read()
    assert len(data) == f["size"], path
    got = hashlib.sha256(data).hexdigest() if f["lfs"] else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert got == f["etag"], f"{path}: content hash {got} != {f['etag']}"
print(f"     {len(expected['files'])} files, commit {ref[:12]}, relative symlinks into blobs/<etag>")
EOF
}

# 1a. hf download (CLI) into the cache
C1="$WORK/cache1"
HF_HUB_CACHE="$C1" "$HF" download acme/tiny > "$WORK/dl1.out" 2>&1 || { cat "$WORK/dl1.out"; fail "hf download"; }
check_cache "$C1" acme/tiny
ok "1a hf download acme/tiny -> cache"

# 1b. snapshot_download (python API) into a fresh cache
C2="$WORK/cache2"
SNAP=$(HF_HUB_CACHE="$C2" "$PY" -c 'from huggingface_hub import snapshot_download as s; print(s("acme/tiny"))') \
    || fail "snapshot_download"
check_cache "$C2" acme/tiny
[ "$SNAP" = "$C2/models--acme--tiny/snapshots/$COMMIT" ] \
    || fail "snapshot_download returned $SNAP"
ok "1b snapshot_download('acme/tiny') -> $SNAP"

# 1c. --local-dir
LD="$WORK/local"
HF_HUB_CACHE="$WORK/cache_unused" "$HF" download acme/tiny --local-dir "$LD" > "$WORK/dl2.out" 2>&1 \
    || { cat "$WORK/dl2.out"; fail "hf download --local-dir"; }
for f in config.json sub/readme.txt model-00001-of-00002.safetensors sub/model-00002-of-00002.safetensors tokenizer.json; do
    cmp -s "$R/acme/tiny/$f" "$LD/$f" || fail "local-dir file $f differs"
    [ -f "$LD/.cache/huggingface/download/$f.metadata" ] || fail "no metadata for $f"
done
ok "1c hf download --local-dir: 5 files identical, .cache/huggingface/download/*.metadata present"

# 2. offline
OFF=$(HF_HUB_OFFLINE=1 HF_HUB_CACHE="$C1" "$PY" -c \
    'from huggingface_hub import snapshot_download as s; print(s("acme/tiny", local_files_only=True))') \
    || fail "offline snapshot_download"
[ "$OFF" = "$C1/models--acme--tiny/snapshots/$COMMIT" ] || fail "offline returned $OFF"
ok "2  HF_HUB_OFFLINE=1 snapshot_download(local_files_only=True) -> snapshot path"

# 3. checksum verification (needs HF_ENDPOINT online: it lists the tree API, then hashes local files)
"$HF" cache verify acme/tiny --cache-dir "$C1" --fail-on-missing-files --fail-on-extra-files > "$WORK/v1.out" 2>&1 \
    || { cat "$WORK/v1.out"; fail "hf cache verify (cache)"; }
"$HF" cache verify acme/tiny --local-dir "$LD" --fail-on-missing-files --fail-on-extra-files > "$WORK/v2.out" 2>&1 \
    || { cat "$WORK/v2.out"; fail "hf cache verify (local dir)"; }
ok "3  hf cache verify acme/tiny --cache-dir / --local-dir: pass"
BLOB=$(readlink -f "$C2/models--acme--tiny/snapshots/$COMMIT/sub/model-00002-of-00002.safetensors")
printf '\xff' | dd of="$BLOB" bs=1 seek=1000 conv=notrunc status=none
if "$HF" cache verify acme/tiny --cache-dir "$C2" > "$WORK/v3.out" 2>&1; then fail "verify passed a corrupted blob"; fi
grep -q "model-00002-of-00002.safetensors" "$WORK/v3.out" || { cat "$WORK/v3.out"; fail "verify output"; }
ok "3  hf cache verify detects a same-size corrupted blob (exit non-zero)"

# 4. gated repo, alias, Authorization never reaches the CDN
curl -sf -X POST "$HF_ENDPOINT/_stats/reset" > /dev/null
C4="$WORK/cache4"
dl_gated() { HF_HUB_CACHE="$C4" "$PY" -c 'from huggingface_hub import snapshot_download as s; s("acme/gated")' 2>&1; }
out=$(dl_gated) && fail "gated download without token succeeded"
grep -q GatedRepoError <<<"$out" || fail "no GatedRepoError without token: $out"
out=$(HF_TOKEN=wrong dl_gated) && fail "gated download with wrong token succeeded"
grep -q GatedRepoError <<<"$out" || fail "no GatedRepoError with wrong token: $out"
HF_TOKEN=sekrit dl_gated > /dev/null || fail "gated download with token"
ok "4  gated: 401/403 GatedRepoError without/with wrong token, download with right token"
HF_HUB_CACHE="$WORK/cache5" "$PY" -c 'from huggingface_hub import hf_hub_download as h, snapshot_download as s
assert open(h("old/tiny", "config.json")).read().startswith("{")
s("old/tiny")' > /dev/null 2>&1 || fail "alias old/tiny"
ok "4  renamed repo old/tiny -> acme/tiny via relative 307 (hf_hub_download + snapshot_download)"
curl -sf "$HF_ENDPOINT/_stats" > "$WORK/stats.json"
"$PY" - "$WORK/stats.json" <<'EOF' || fail "stats"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["auth_leaks"] == 0, s
assert s["cdn_get"] >= 3, s
print(f"     stats: {s['cdn_get']} CDN GETs, auth_leaks=0, resolve HEAD/GET {s['resolve_head']}/{s['resolve_get']}")
EOF
ok "4  no Authorization header reached the CDN"
echo "hub_server_check: all checks passed"
