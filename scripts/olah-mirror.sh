#!/usr/bin/env bash
# Runs a real Hugging Face mirror, olah (PyPI `olah`), in offline mode. It
# serves one local git repo, and its large files are stored with git-lfs. The
# integration tests point HF_ENDPOINT at it.
#
#   scripts/olah-mirror.sh start WORKDIR PORT ORG/NAME SRC_DIR
#       Installs git, git-lfs and olah if they are missing. olah goes into its
#       own venv, $OLAH_VENV, which defaults to /var/tmp/xfer-venv-olah.
#       Commits SRC_DIR's files into WORKDIR/mirrors/models/ORG/NAME. Files of
#       1 MiB or more, and *.safetensors, go through git-lfs. Starts olah on
#       127.0.0.1:PORT. Once it answers, prints `READY http://127.0.0.1:PORT`
#       on stdout; everything else goes to stderr.
#       Running start again rebuilds the repo and restarts olah. The commit is
#       reproducible: same files, same sha, because dates and author are fixed.
#   scripts/olah-mirror.sh stop WORKDIR
#       Stops the olah that WORKDIR/olah.pid names.
#   scripts/olah-mirror.sh install
#       Only installs git, git-lfs and olah if they are missing (what start
#       does first); scripts/test.sh runs it before the tests.
#
# Files under WORKDIR: config.toml; olah.log, where olah writes stdout and
# stderr; olah.pid; logs/, olah's own log dir; repos/, its cache, which stays
# unused offline; home/, which is $HOME for olah, so its ~/.olah sqlite db
# lands here; mirrors/models/ORG/NAME/.git, the served repo.
#
# How olah 0.5.4 serves a local mirror (olah/mirror/repos.py,
# olah/server_mirror.py):
# - The repo lives at {mirrors-path}/{models|datasets|spaces}/{org}/{name}.
# - It is opened with GitPython, and refs and commits come from git objects.
# - The working tree is never read, so this script leaves it empty: the index
#   is built straight from SRC_DIR through --work-tree.
# - An LFS file is a blob of 121 to 149 bytes that parses as a git-lfs pointer.
#   Its content is read from {repo}/.git/lfs/objects/aa/bb/<sha256>.
# - olah reads whole files into memory for GET, and for HEAD on an LFS file,
#   where it re-hashes the file. Keep test files small: tens of MiB, not GiB.
set -euo pipefail

OLAH_VENV=${OLAH_VENV:-/var/tmp/xfer-venv-olah}
# Fixed identity and dates make the commit sha depend only on the content.
FIXED_DATE="2024-01-01T00:00:00+0000"

log() { echo "olah-mirror: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  cat >&2 <<EOF
usage: $0 start WORKDIR PORT ORG/NAME SRC_DIR
       $0 stop WORKDIR
       $0 install
EOF
  exit 2
}

# apt packages: git, and git-lfs for its clean filter.
ensure_apt() {
  local missing=()
  command -v git >/dev/null || missing+=(git)
  git lfs version >/dev/null 2>&1 || missing+=(git-lfs)
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]} (apt)"
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=300)
  [ "$(id -u)" -eq 0 ] || apt=(sudo "${apt[@]}")
  # Try without `apt-get update` first: the lists are usually fresh enough.
  if ! "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    "${apt[@]}" update >/dev/null
    "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
  fi
  git lfs version >/dev/null 2>&1 || die "git-lfs still missing after apt-get install"
}

# olah gets its own venv. A lock guards against a concurrent start.
ensure_olah() {
  [ -x "$OLAH_VENV/bin/olah-cli" ] && return 0
  mkdir -p "$(dirname "$OLAH_VENV")"
  (
    flock 9
    if [ ! -x "$OLAH_VENV/bin/olah-cli" ]; then
      log "installing olah into $OLAH_VENV (pip)"
      [ -x "$OLAH_VENV/bin/pip" ] || python3 -m venv "$OLAH_VENV"
      "$OLAH_VENV/bin/pip" install -q --disable-pip-version-check olah >&2
    fi
  ) 9>"$OLAH_VENV.lock"
  [ -x "$OLAH_VENV/bin/olah-cli" ] || die "olah-cli not found in $OLAH_VENV"
}

# Prints a gitattributes pattern matching exactly the path $1, relative to
# the repo root.
attr_pattern() {
  local p="/$1"
  # Glob characters must match literally.
  p=$(printf '%s' "$p" | sed -e 's/[][\\*?]/\\&/g')
  case "$p" in
    *[[:space:]\"]*)
      # Quoted C style. Unquoting happens before glob matching, so backslashes
      # are doubled.
      p=$(printf '%s' "$p" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g')
      printf '"%s"\n' "$p"
      ;;
    *) printf '%s\n' "$p" ;;
  esac
}

build_repo() {
  local src=$1 repo=$2
  rm -rf "$repo"
  mkdir -p "$repo"
  # Leave the user's global and system config out: signing, hooks, and so on.
  export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
  git init -q -b main "$repo"
  git -C "$repo" lfs install --local >/dev/null
  local attrs="$repo/.git/info/attributes"
  mkdir -p "$repo/.git/info"
  # .git/info/attributes, not a committed .gitattributes, keeps the served
  # tree identical to SRC_DIR.
  echo '*.safetensors filter=lfs diff=lfs merge=lfs -text' >"$attrs"
  local f rel
  while IFS= read -r -d '' f; do
    rel=${f#"$src"/}
    echo "$(attr_pattern "$rel") filter=lfs diff=lfs merge=lfs -text" >>"$attrs"
  done < <(find "$src" -path "$src/.git" -prune -o -type f -size +1048575c -print0)

  local g=(git --git-dir="$repo/.git" --work-tree="$src"
    -c user.name=xfer-test -c user.email=xfer-test@localhost
    -c core.autocrlf=false -c core.safecrlf=false)
  "${g[@]}" add -A -f
  GIT_AUTHOR_DATE=$FIXED_DATE GIT_COMMITTER_DATE=$FIXED_DATE \
    "${g[@]}" commit -q --allow-empty --no-verify -m "import $(basename "$src")"
  # Every pointer in the commit needs its object on disk.
  local n=0 oid
  while read -r oid; do
    [ -f "$repo/.git/lfs/objects/${oid:0:2}/${oid:2:2}/$oid" ] || die "LFS object $oid missing"
    n=$((n + 1))
  done < <(git -C "$repo" lfs ls-files -l | awk '{print $1}')
  log "repo $repo: commit $(git -C "$repo" rev-parse HEAD), $n LFS file(s)"
}

# Stops the olah that WORKDIR/olah.pid names. Only that pid is signalled.
stop_olah() {
  local workdir=$1 pidfile="$1/olah.pid" pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  # Make sure the pid is still our olah, not a reused one.
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "olah-cli -c $workdir/config.toml"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    log "stopped olah (pid $pid)"
  fi
  rm -f "$pidfile"
}

cmd_start() {
  [ $# -eq 4 ] || usage
  local workdir=$1 port=$2 repo_id=$3 src=$4
  [[ $port =~ ^[0-9]+$ ]] || die "PORT must be a number: $port"
  [[ $repo_id =~ ^[^/]+/[^/]+$ ]] || die "ORG/NAME expected, got: $repo_id"
  [ -d "$src" ] || die "SRC_DIR is not a directory: $src"
  mkdir -p "$workdir"
  workdir=$(cd "$workdir" && pwd)
  src=$(cd "$src" && pwd)

  ensure_apt
  ensure_olah
  stop_olah "$workdir"

  # A server already on PORT would answer the readiness probe in our place.
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port is already in use"
  fi

  local org=${repo_id%%/*} name=${repo_id#*/}
  build_repo "$src" "$workdir/mirrors/models/$org/$name"

  mkdir -p "$workdir/repos" "$workdir/logs" "$workdir/home"
  cat >"$workdir/config.toml" <<EOF
[basic]
host = "127.0.0.1"
port = $port
repos-path = "$workdir/repos"
mirrors-path = ["$workdir/mirrors"]
mirror-scheme = "http"
mirror-netloc = "127.0.0.1:$port"
mirror-lfs-netloc = "127.0.0.1:$port"

[accessibility]
offline = true

[[accessibility.proxy]]
repo = "*"
allow = true

[[accessibility.proxy]]
repo = "*/*"
allow = true

[[accessibility.cache]]
repo = "*"
allow = true

[[accessibility.cache]]
repo = "*/*"
allow = true
EOF

  # olah keeps a sqlite db in ~/.olah, so HOME points into WORKDIR.
  (
    cd "$workdir"
    HOME="$workdir/home" GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 \
      nohup "$OLAH_VENV/bin/olah-cli" -c "$workdir/config.toml" --log-path "$workdir/logs" \
      >"$workdir/olah.log" 2>&1 </dev/null &
    echo $! >"$workdir/olah.pid"
  )
  local pid url="http://127.0.0.1:$port"
  pid=$(cat "$workdir/olah.pid")
  # Ready means the mirror answers for our repo, not just that the port is open.
  for _ in $(seq 150); do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$workdir/olah.log" >&2 || true
      rm -f "$workdir/olah.pid"
      die "olah exited during startup (is port $port free?)"
    fi
    if curl -sf -o /dev/null --max-time 2 "$url/api/models/$repo_id/revision/main" &&
      kill -0 "$pid" 2>/dev/null; then
      log "olah pid $pid serving $repo_id"
      echo "READY $url"
      return 0
    fi
    sleep 0.2
  done
  tail -n 30 "$workdir/olah.log" >&2 || true
  stop_olah "$workdir"
  die "olah did not answer within 30 s"
}

cmd_stop() {
  [ $# -eq 1 ] || usage
  local workdir
  workdir=$(cd "$1" && pwd) || die "no such WORKDIR: $1"
  stop_olah "$workdir"
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  install) shift; [ $# -eq 0 ] || usage; ensure_apt; ensure_olah ;;
  *) usage ;;
esac
