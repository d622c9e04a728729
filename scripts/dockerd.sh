#!/usr/bin/env bash
# Private Docker daemons for tests and benchmarks: one dockerd per directory,
# each optionally inside a network namespace, none touching the machine's own
# Docker (if any), its iptables or its bridges. Images are built locally, no
# pulls (there is no registry to pull from).
#
#   scripts/dockerd.sh install             apt-get docker.io, busybox-static (and
#                                          python3's stdlib) when missing; quiet
#   scripts/dockerd.sh start DIR [NETNS]   start DIR's daemon (in NETNS, else the
#                                          root namespace); prints unix://DIR/docker.sock
#                                          once `docker info` answers; a no-op
#                                          (prints the socket) when it already runs
#   scripts/dockerd.sh stop DIR            stop DIR's daemon: SIGTERM, wait, then
#                                          SIGKILL what is left of it (its containerd,
#                                          its shims); unmount and remove its exec-root
#   scripts/dockerd.sh images SOCK [BASE_MIB [TOP_MIB]]
#                                          build the test images in that daemon, skipping
#                                          those present; prints "NAME ID" per image
#   scripts/dockerd.sh sock DIR            print DIR's socket address
#   scripts/dockerd.sh status DIR          exit 0 when DIR's daemon runs and answers
#
# Or source it and call dockerd_install, dockerd_start DIR [NETNS],
# dockerd_stop DIR, dockerd_images SOCK [BASE_MIB [TOP_MIB]], dockerd_sock
# DIR, dockerd_up DIR, dockerd_exec_root DIR (each runs in a subshell of its own
# with set -euo pipefail; sourcing changes none of the caller's options).
#
# DIR holds the daemon's data-root (DIR/data, kept across stop/start, so the
# images stay), its socket DIR/docker.sock, pidfile DIR/dockerd.pid, log
# DIR/dockerd.log and config DIR/daemon.json (empty: /etc/docker/daemon.json
# is never read). The exec-root is /run/xfer-dockerd/<12 hex of sha256(DIR)>:
# containerd puts its sockets under it, and a unix socket path has at most
# 108 bytes. DIR itself must be at most 90 bytes long for the same reason.
#
# Every daemon runs with --iptables=false --ip-forward=false --ip-masq=false
# --bridge=none: a dockerd with default flags loads br_netfilter and sets the
# host's iptables FORWARD policy to DROP. Containers get no network of their
# own; `docker run --network host` shares the daemon's namespace (NETNS).
# The daemon enters NETNS with `nsenter --net=/run/netns/NETNS`, not `ip
# netns exec`, which remounts /sys and leaves dockerd without its cgroup
# mounts ("Devices cgroup isn't mounted"). Its containerd is its own (started
# by dockerd, under the exec-root), unless /run/containerd/containerd.sock
# exists: dockerd 20.10 then uses that system containerd (start warns: its
# containers would not be in NETNS); each daemon uses containerd namespaces
# of its own (xfer-<hash>) either way.
#
# The images (BASE_MIB default 8, TOP_MIB default 1):
#   xt/base:1     busybox-static (with its applets as /bin links) and
#                 /data/base.bin, BASE_MIB MiB of random bytes; `docker import`
#   xt/app:1, xt/app:2   FROM xt/base:1 plus /data/top.bin, TOP_MIB MiB of random
#                 bytes (a different file each), `docker build` (legacy builder);
#                 both share xt/base:1's layer (checked: same first diff_id)
#   xt/standin:1  Debian's /usr/bin/python3 with its shared libraries and stdlib
#                 (no test/, idlelib, tkinter, ensurepip, lib2to3, __pycache__),
#                 busybox for sh, tests/standin in /opt/standin,
#                 PATH=/opt/standin/bin:/usr/local/bin:/usr/bin:/bin,
#                 PYTHONPATH=/opt/standin/pylib; checked with `vllm --version`
#                 and `python3 -c 'import json,socket,http.server'`
#                 (XT_STANDIN=0 skips it)
# An image that exists is kept, except xt/base:1 when its label xt.base_mib
# (or xt/app's xt.top_mib) says another size: then it and the xt/app images
# are built again.
#
# Env: DOCKER_CLI (default docker), DOCKERD_TIMEOUT (seconds start waits, 60),
# DOCKERD_STOP_TIMEOUT (seconds stop waits after SIGTERM, 30), XT_STANDIN (1).
# Needs root.

XFER_DOCKERD_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

_dd_say() { echo "dockerd.sh: $*" >&2; }
_dd_die() {
    _dd_say "$*"
    exit 1
}
_dd_docker() { "${DOCKER_CLI:-docker}" "$@"; }

# _dd_dir DIR: DIR made absolute (it need not exist), no trailing slash.
_dd_dir() {
    [ -n "${1:-}" ] || _dd_die "DIR missing"
    local d
    d=$(realpath -m -- "$1")
    echo "$d"
}

dockerd_exec_root() (
    set -euo pipefail
    local d h
    d=$(_dd_dir "$1")
    h=$(printf '%s' "$d" | sha256sum | cut -c1-12)
    echo "/run/xfer-dockerd/$h"
)

dockerd_sock() (
    set -euo pipefail
    echo "unix://$(_dd_dir "$1")/docker.sock"
)

# _dd_pids DIR: pids of the dockerd processes whose argv has exactly
# `--data-root DIR/data` (whatever their pidfile says).
_dd_pids() {
    local data=$1/data p
    for p in /proc/[0-9]*; do
        [ -r "$p/cmdline" ] || continue
        # One argument per line; the pair must be adjacent.
        if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | awk -v d="$data" '
            NR == 1 && $0 !~ /(^|\/)dockerd$/ { exit 1 }
            prev == "--data-root" && $0 == d { found = 1 }
            $0 == "--data-root=" d { found = 1 }
            { prev = $0 }
            END { exit !found }'; then
            echo "${p#/proc/}"
        fi
    done
}

# _dd_procs_with ARG: pids whose argv contains the exact argument ARG.
_dd_procs_with() {
    local p
    for p in /proc/[0-9]*; do
        [ -r "$p/cmdline" ] || continue
        if tr '\0' '\n' <"$p/cmdline" 2>/dev/null | grep -Fqx -- "$1"; then echo "${p#/proc/}"; fi
    done
}

_dd_descendants() {
    local c
    for c in $(pgrep -P "$1" 2>/dev/null); do
        echo "$c"
        _dd_descendants "$c"
    done
}

# dockerd_up DIR: true when DIR's daemon runs and answers `docker info`.
dockerd_up() (
    set -euo pipefail
    local d
    d=$(_dd_dir "$1")
    [ -S "$d/docker.sock" ] || exit 1
    [ -n "$(_dd_pids "$d")" ] || exit 1
    timeout 10 "${DOCKER_CLI:-docker}" -H "unix://$d/docker.sock" info >/dev/null 2>&1
)

dockerd_install() (
    set -euo pipefail
    local pkgs=()
    command -v dockerd >/dev/null 2>&1 && command -v containerd >/dev/null 2>&1 &&
        command -v runc >/dev/null 2>&1 && command -v "${DOCKER_CLI:-docker}" >/dev/null 2>&1 ||
        pkgs+=(docker.io)
    # busybox-static: /bin/busybox must be static (it goes into images with no libc).
    if ! [ -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then pkgs+=(busybox-static); fi
    # The stand-in image copies Debian's python3 and its whole stdlib
    # (http.server is not in python3-minimal).
    if ! [ -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import json, socket, http.server' >/dev/null 2>&1; then
        pkgs+=(python3-minimal libpython3-stdlib)
    fi
    command -v nsenter >/dev/null 2>&1 || pkgs+=(util-linux)
    # A registry to pull from (tests/images.rs: `xfer image pull`), skopeo
    # to push the test images into it, htpasswd for its password file.
    command -v docker-registry >/dev/null 2>&1 || pkgs+=(docker-registry)
    command -v skopeo >/dev/null 2>&1 || pkgs+=(skopeo)
    command -v htpasswd >/dev/null 2>&1 || pkgs+=(apache2-utils)
    [ ${#pkgs[@]} -gt 0 ] || exit 0
    local log
    log=$(mktemp /tmp/xfer-dockerd-apt.XXXXXX)
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"; } >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        _dd_die "apt-get install ${pkgs[*]} failed"
    fi
    rm -f "$log"
    command -v dockerd >/dev/null 2>&1 || _dd_die "dockerd still missing after installing ${pkgs[*]}"
)

dockerd_start() (
    set -euo pipefail
    local d ns=${2:-} er sock t
    d=$(_dd_dir "$1")
    [ "$(id -u)" = 0 ] || _dd_die "needs root"
    [ ${#d} -le 90 ] || _dd_die "DIR too long (${#d} bytes, at most 90): $d"
    command -v dockerd >/dev/null 2>&1 || _dd_die "dockerd not installed (scripts/dockerd.sh install)"
    if [ -n "$ns" ] && ! [ -e "/run/netns/$ns" ]; then _dd_die "no network namespace $ns (/run/netns/$ns)"; fi
    er=$(dockerd_exec_root "$d")
    sock="unix://$d/docker.sock"
    t=${DOCKERD_TIMEOUT:-60}
    if [ -z "$(_dd_pids "$d")" ]; then
        # A daemon with another data-root may not use this exec-root (the
        # hash makes that unlikely; a collision is refused).
        if [ -S "$er/containerd/containerd.sock" ] && [ -n "$(_dd_procs_with "$er/containerd/containerd.toml")" ]; then
            _dd_die "exec-root $er is in use by another daemon"
        fi
        if [ -n "$ns" ] && [ -S /run/containerd/containerd.sock ]; then
            _dd_say "warning: /run/containerd/containerd.sock exists, so dockerd uses that containerd: containers will not run in $ns"
        fi
        mkdir -p "$d/data" "$er"
        rm -f "$d/docker.sock" "$d/dockerd.pid"
        [ -f "$d/daemon.json" ] || echo '{}' >"$d/daemon.json"
        local h=${er##*/}
        local cmd=(dockerd
            --config-file "$d/daemon.json"
            --data-root "$d/data" --exec-root "$er" --pidfile "$d/dockerd.pid"
            -H "$sock"
            --iptables=false --ip-forward=false --ip-masq=false --bridge=none
            --containerd-namespace "xfer-$h" --containerd-plugins-namespace "xfer-$h-plugins")
        if [ -n "$ns" ]; then cmd=(nsenter "--net=/run/netns/$ns" "${cmd[@]}"); fi
        {
            echo "=== $(date -u +%FT%TZ) start${ns:+ in netns $ns}: ${cmd[*]}"
        } >>"$d/dockerd.log"
        # A session of its own: a ^C or a process-group kill aimed at the
        # caller does not reach it; `stop` does.
        setsid "${cmd[@]}" >>"$d/dockerd.log" 2>&1 </dev/null &
    fi
    local i
    for ((i = 0; i < t * 5; i++)); do
        if [ -S "$d/docker.sock" ] && timeout 10 "${DOCKER_CLI:-docker}" -H "$sock" info >/dev/null 2>&1; then
            echo "$sock"
            exit 0
        fi
        if ((i > 5)) && [ -z "$(_dd_pids "$d")" ]; then
            tail -n 20 "$d/dockerd.log" >&2
            _dd_die "dockerd for $d exited at start (log above, $d/dockerd.log)"
        fi
        sleep 0.2
    done
    tail -n 20 "$d/dockerd.log" >&2
    _dd_die "dockerd for $d did not answer within $t s (log above, $d/dockerd.log)"
)

# _dd_umount_under PATH...: lazily unmount every mount at or below each PATH,
# deepest first.
_dd_umount_under() {
    local p m
    for p in "$@"; do
        awk -v p="$p" '$2 == p || index($2, p "/") == 1 { print $2 }' /proc/mounts |
            awk '{ print length($0), $0 }' | sort -rn | cut -d' ' -f2- |
            while read -r m; do
                # /proc/mounts escapes blanks as \040 etc.
                m=$(printf '%b' "$m")
                umount -l -- "$m" 2>/dev/null || umount -f -l -- "$m" 2>/dev/null || true
            done
    done
}

dockerd_stop() (
    set -euo pipefail
    local d er
    d=$(_dd_dir "$1")
    er=$(dockerd_exec_root "$d")
    local t=${DOCKERD_STOP_TIMEOUT:-30}
    local daemons=() others=() p
    mapfile -t daemons < <(_dd_pids "$d")
    # Its containerd (argv names its config under the exec-root) and the
    # shims (argv names that containerd's socket), with their children
    # (the containers' processes), listed before anything dies.
    mapfile -t others < <({
        _dd_procs_with "$er/containerd/containerd.toml"
        for p in $(_dd_procs_with "$er/containerd/containerd.sock"); do
            echo "$p"
            _dd_descendants "$p"
        done
        for p in "${daemons[@]}"; do _dd_descendants "$p"; done
    } | sort -un)
    if [ ${#daemons[@]} -gt 0 ]; then
        kill -TERM "${daemons[@]}" 2>/dev/null || true
        local i alive
        for ((i = 0; i < t * 10; i++)); do
            alive=0
            for p in "${daemons[@]}"; do [ ! -e "/proc/$p" ] || alive=1; done
            [ "$alive" = 1 ] || break
            sleep 0.1
        done
        if [ "$alive" = 1 ]; then
            _dd_say "dockerd for $d did not exit within $t s of SIGTERM; SIGKILL"
            kill -KILL "${daemons[@]}" 2>/dev/null || true
        fi
    fi
    # Whatever of it is left (containerd exits with dockerd; shims of
    # running containers outlive both).
    local left=()
    for p in "${others[@]}"; do [ ! -e "/proc/$p" ] || left+=("$p"); done
    if [ ${#left[@]} -gt 0 ]; then
        sleep 0.5
        kill -KILL "${left[@]}" 2>/dev/null || true
    fi
    for ((i = 0; i < 50; i++)); do
        alive=0
        for p in "${daemons[@]}" "${others[@]}"; do [ -z "$p" ] || [ ! -e "/proc/$p" ] || alive=1; done
        [ "$alive" = 1 ] || break
        sleep 0.1
    done
    _dd_umount_under "$d/data" "$er"
    if awk -v a="$d/data" -v b="$er" '$2 == a || index($2, a "/") == 1 || $2 == b || index($2, b "/") == 1 { f = 1 } END { exit !f }' /proc/mounts; then
        _dd_die "mounts left under $d/data or $er: $(awk -v a="$d/data" -v b="$er" '$2 == a || index($2, a "/") == 1 || $2 == b || index($2, b "/") == 1 { print $2 }' /proc/mounts | tr '\n' ' ')"
    fi
    rm -rf --one-file-system -- "$er"
    rmdir /run/xfer-dockerd 2>/dev/null || true
    rm -f "$d/docker.sock" "$d/dockerd.pid"
    if [ ${#daemons[@]} -gt 0 ]; then echo "=== $(date -u +%FT%TZ) stopped" >>"$d/dockerd.log"; fi
)

# ----------------------------------------------------------------- images ----

_dd_label() { # _dd_label IMAGE LABEL: the label's value ("" if none or no image)
    _dd_docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}
_dd_has() { _dd_docker image inspect "$1" >/dev/null 2>&1; }
_dd_id() { _dd_docker image inspect --format '{{.Id}}' "$1"; }

# _dd_busybox ROOT: /bin/busybox, /bin/sh and every applet as a link.
_dd_busybox() {
    local root=$1 a
    mkdir -p "$root/bin" "$root/tmp" "$root/etc" "$root/root"
    chmod 1777 "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    for a in $(/bin/busybox --list); do
        [ "$a" = busybox ] || [ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\n' >"$root/etc/group"
}

# _dd_copy_libs ROOT FILE...: the shared libraries (and the loader) FILEs
# need, copied to the same paths under ROOT.
_dd_copy_libs() {
    local root=$1 lib
    shift
    ldd "$@" 2>/dev/null | awk '/=> \// { print $3 } /^[ \t]*\/[^ ]+ \(/ { print $1 }' | sort -u |
        while read -r lib; do
            [ -e "$root$lib" ] && continue
            mkdir -p "$root$(dirname "$lib")"
            cp -L "$lib" "$root$lib"
        done
}

_dd_standin_rootfs() {
    local root=$1 py pyver stdlib
    py=$(readlink -f /usr/bin/python3)
    [ -x "$py" ] || _dd_die "/usr/bin/python3 missing (scripts/dockerd.sh install)"
    pyver=$(basename "$py")
    stdlib=/usr/lib/$pyver
    [ -f "$stdlib/os.py" ] || _dd_die "no stdlib at $stdlib"
    _dd_busybox "$root"
    mkdir -p "$root/usr/bin" "$root/usr/lib" "$root/usr/local/bin" "$root/opt"
    cp "$py" "$root/usr/bin/$pyver"
    ln -s "$pyver" "$root/usr/bin/python3"
    tar -C /usr/lib -c \
        --exclude="$pyver/test" --exclude="$pyver/idlelib" --exclude="$pyver/tkinter" \
        --exclude="$pyver/ensurepip" --exclude="$pyver/lib2to3" --exclude="$pyver/turtledemo" \
        --exclude="$pyver/config-*" --exclude="$pyver/site-packages" --exclude="$pyver/dist-packages" \
        --exclude='__pycache__' --exclude="$pyver/lib-dynload/_test*" --exclude="$pyver/lib-dynload/xx*" \
        --exclude="$pyver/lib-dynload/_ctypes_test*" \
        "$pyver" | tar -C "$root/usr/lib" -x
    _dd_copy_libs "$root" "$py" "$root$stdlib"/lib-dynload/*.so
    tar -C "$XFER_DOCKERD_REPO/tests" -c --exclude='__pycache__' --exclude='*.pyc' standin |
        tar -C "$root/opt" -x
}

_dd_import() { # _dd_import ROOTFS NAME CHANGE...: prints the id
    local root=$1 name=$2
    shift 2
    local ch=() c
    for c in "$@"; do ch+=(--change "$c"); done
    tar -C "$root" --numeric-owner --owner=0 --group=0 -c . | _dd_docker import "${ch[@]}" - "$name" >/dev/null
}

_dd_build_app() { # _dd_build_app TAG TOP_MIB
    local tag=$1 mib=$2 ctx
    ctx=$(mktemp -d /tmp/xfer-xt-app.XXXXXX)
    head -c $((mib << 20)) /dev/urandom >"$ctx/top.bin"
    printf 'FROM xt/base:1\nLABEL xt.top_mib=%s\nCOPY top.bin /data/top.bin\n' "$mib" >"$ctx/Dockerfile"
    if ! DOCKER_BUILDKIT=0 _dd_docker build -q -t "$tag" "$ctx" >"$ctx/build.log" 2>&1; then
        cat "$ctx/build.log" >&2
        rm -rf "$ctx"
        _dd_die "docker build $tag failed"
    fi
    rm -rf "$ctx"
}

dockerd_images() (
    set -euo pipefail
    local sock=${1:-} base_mib=${2:-8} top_mib=${3:-1}
    [ -n "$sock" ] || _dd_die "usage: images SOCK [BASE_MIB [TOP_MIB]]"
    [[ $base_mib =~ ^[0-9]+$ && $top_mib =~ ^[0-9]+$ && $top_mib -ge 1 ]] || _dd_die "BASE_MIB and TOP_MIB must be integers (TOP_MIB at least 1)"
    case $sock in *://*) ;; *) sock=unix://$sock ;; esac
    export DOCKER_HOST=$sock
    _dd_docker version >/dev/null 2>&1 || _dd_die "no daemon answers at $sock"
    local work
    work=$(mktemp -d /tmp/xfer-xt.XXXXXX)
    trap 'rm -rf "$work"' EXIT

    if _dd_has xt/base:1 && [ "$(_dd_label xt/base:1 xt.base_mib)" != "$base_mib" ]; then
        _dd_say "xt/base:1 has $(_dd_label xt/base:1 xt.base_mib) MiB, want $base_mib: building it and xt/app again"
        _dd_docker rmi -f xt/app:1 xt/app:2 xt/base:1 >/dev/null 2>&1 || true
    fi
    if ! _dd_has xt/base:1; then
        _dd_busybox "$work/base"
        mkdir -p "$work/base/data"
        head -c $((base_mib << 20)) /dev/urandom >"$work/base/data/base.bin"
        _dd_import "$work/base" xt/base:1 'CMD ["/bin/sh"]' "LABEL xt.base_mib=$base_mib"
        rm -rf "$work/base"
    fi
    local tag
    for tag in xt/app:1 xt/app:2; do
        if _dd_has "$tag" && [ "$(_dd_label "$tag" xt.top_mib)" != "$top_mib" ]; then
            _dd_docker rmi -f "$tag" >/dev/null
        fi
        _dd_has "$tag" || _dd_build_app "$tag" "$top_mib"
    done
    # Both apps must sit on xt/base:1's very layer.
    local lb l1 l2
    lb=$(_dd_docker image inspect --format '{{json .RootFS.Layers}}' xt/base:1)
    l1=$(_dd_docker image inspect --format '{{json .RootFS.Layers}}' xt/app:1)
    l2=$(_dd_docker image inspect --format '{{json .RootFS.Layers}}' xt/app:2)
    lb=$(jq -r '.[0]' <<<"$lb")
    if [ "$(jq -r '.[0]' <<<"$l1")" != "$lb" ] || [ "$(jq -r '.[0]' <<<"$l2")" != "$lb" ]; then
        _dd_die "xt/app:1 or xt/app:2 does not share xt/base:1's layer ($lb): $l1 $l2"
    fi
    if [ "$(jq -r 'length' <<<"$l1")" != 2 ] || [ "$(jq -r '.[1]' <<<"$l1")" = "$(jq -r '.[1]' <<<"$l2")" ]; then
        _dd_die "xt/app:1 and xt/app:2 should each have one top layer of their own: $l1 $l2"
    fi

    if [ "${XT_STANDIN:-1}" != 0 ] && ! _dd_has xt/standin:1; then
        _dd_standin_rootfs "$work/standin"
        _dd_import "$work/standin" xt/standin:1 \
            'ENV PATH=/opt/standin/bin:/usr/local/bin:/usr/bin:/bin' \
            'ENV PYTHONPATH=/opt/standin/pylib' \
            'ENV PYTHONDONTWRITEBYTECODE=1' \
            'CMD ["/bin/sh"]'
        rm -rf "$work/standin"
        local v
        if ! v=$(_dd_docker run --rm --network none xt/standin:1 vllm --version 2>&1) || [ -z "$v" ]; then
            _dd_docker rmi xt/standin:1 >/dev/null 2>&1 || true
            _dd_die "xt/standin:1 cannot run the stand-in: $v"
        fi
        if ! v=$(_dd_docker run --rm --network none xt/standin:1 python3 -c 'import json, socket, http.server' 2>&1); then
            _dd_docker rmi xt/standin:1 >/dev/null 2>&1 || true
            _dd_die "xt/standin:1's python3 lacks its stdlib: $v"
        fi
    fi
    for tag in xt/base:1 xt/app:1 xt/app:2; do echo "$tag $(_dd_id "$tag")"; done
    if _dd_has xt/standin:1; then echo "xt/standin:1 $(_dd_id xt/standin:1)"; fi
)

# ----------------------------------------------------------------- command ----

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -euo pipefail
    _dd_cmd=${1:-}
    shift || true
    case $_dd_cmd in
        install) [ $# -eq 0 ] || _dd_die "usage: $0 install"; dockerd_install ;;
        start) { [ $# -ge 1 ] && [ $# -le 2 ]; } || _dd_die "usage: $0 start DIR [NETNS]"; dockerd_start "$@" ;;
        stop) [ $# -eq 1 ] || _dd_die "usage: $0 stop DIR"; dockerd_stop "$1" ;;
        images) { [ $# -ge 1 ] && [ $# -le 3 ]; } || _dd_die "usage: $0 images SOCK [BASE_MIB [TOP_MIB]]"; dockerd_images "$@" ;;
        sock) [ $# -eq 1 ] || _dd_die "usage: $0 sock DIR"; dockerd_sock "$1" ;;
        status) [ $# -eq 1 ] || _dd_die "usage: $0 status DIR"; dockerd_up "$1" ;;
        -h | --help | help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' ;;
        *)
            sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
            exit 2
            ;;
    esac
fi
