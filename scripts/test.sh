#!/usr/bin/env bash
# Command 2 of the README: installs what the test suite needs (idempotently),
# then runs all of it: formatting, lints, unit, simulation and integration
# tests. Needs root for apt-get, tmpfs mounts and network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests use: b3sum (cross-checks file hashes), rsync and
# iperf3 (benchmark baselines), nftables/iproute2 (netns tests), util-linux
# (mount for the full-disk test), iputils-ping (netns cluster checks), GNU
# time (peak RSS), python3 and git-lfs (the Hub test server and the olah
# mirror of the pull tests), and libibverbs-dev, librdmacm-dev and
# libclang-dev (rdma-sys, to build the RDMA backend: feature `rdma`), and
# docker.io and busybox-static (tests/images.rs: one private dockerd per
# namespace host, test images from a static busybox), and docker-registry,
# skopeo and apache2-utils (its htpasswd) for `xfer image pull`'s registry,
# and podman and catatonit (its `--init`) for the podman path, and Slurm
# (slurmctld, slurmd, slurm-client, munge) for tests/slurm.rs's real jobs.
packages=(b3sum rsync iperf3 nftables iproute2 iputils-ping util-linux time
  python3 python3-venv curl git git-lfs libibverbs-dev librdmacm-dev libclang-dev
  docker.io busybox-static docker-registry skopeo apache2-utils podman catatonit
  slurmctld slurmd slurm-client munge)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The real Hugging Face client, which the pull tests use to read and verify
# what `xfer pull` wrote (tests/pull.rs expects it at this path).
hf_venv=/var/tmp/xfer-venv-hf
if ! "$hf_venv/bin/python" -c 'import huggingface_hub' 2>/dev/null || [ ! -x "$hf_venv/bin/hf" ]; then
  echo "installing huggingface_hub into $hf_venv"
  [ -x "$hf_venv/bin/pip" ] || python3 -m venv "$hf_venv"
  "$hf_venv/bin/pip" install -q --disable-pip-version-check 'huggingface_hub==2.4.0'
fi
# olah, a real Hub mirror, in its own venv (a no-op when it is there).
scripts/olah-mirror.sh install
# Real engines for the launcher's tests (tests/engines.rs, the SGLang parser
# test): vLLM's CPU build, Ray and SGLang, in one venv outside the tree
# (about 3 minutes and 6 GB the first time, a no-op after). If PyPI cannot
# be reached the rest of the suite still runs, and those tests fail, each
# saying the engines are missing: they are never skipped.
scripts/engines.sh install || echo "engines: install failed (above); tests/engines.rs will fail saying so" >&2

# A running dockerd (the host's own, with its defaults) loads br_netfilter
# and sets the FORWARD policy to DROP; the suite must pass beside one, so
# one is started when none is running, and only that one is stopped at the
# end. The image tests start their own, one per namespace host.
started_dockerd=""
stop_dockerd() {
  [ -n "$started_dockerd" ] || return 0
  kill "$started_dockerd" 2>/dev/null || true
  wait "$started_dockerd" 2>/dev/null || true
}
trap stop_dockerd EXIT
if ! docker info >/dev/null 2>&1 && command -v dockerd >/dev/null; then
  echo "starting dockerd (stopped at the end)"
  dockerd --pidfile /run/xfer-test-dockerd.pid >/var/tmp/xfer-test-dockerd.log 2>&1 &
  started_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
fi

command -v cargo >/dev/null || { echo "cargo not found: install Rust with rustup first" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt

# Each step prints its name and, at the next step, how long it took, so a
# slow CI run says where its minutes went.
step_started=$SECONDS
step() {
  echo "== $* (previous step: $((SECONDS - step_started)) s, total $((SECONDS / 60)) min $((SECONDS % 60)) s)"
  step_started=$SECONDS
}

# A clean CI build gains nothing from incremental compilation's
# bookkeeping, nor from debug info: a failing test names its file and line
# without it (backtraces are not printed in CI).
if [ -n "${CI:-}" ]; then
  export CARGO_INCREMENTAL=0
  export CARGO_PROFILE_DEV_DEBUG=false
fi
step "cargo fmt --check"
cargo fmt --all -- --check
# One lint of everything, with the RDMA backend (transport/rdma/sys.rs,
# over libibverbs, behind the `rdma` feature) on: no RDMA device exists
# here, so it cannot run, but linting it and building the suite with it
# keeps it compiling and linking, and the suite then also shows that a
# build with the backend falls back to QUIC where no device is found.
# scripts/rdma-selftest.sh runs it on real hardware. (A second lint
# without the feature cost 56 s of a 22-minute CI run for one function;
# a separate `cargo build --features rdma`, 204 s.)
step "cargo clippy --features xfer/rdma -D warnings"
cargo clippy --workspace --all-targets --features xfer/rdma -- -D warnings
# `--all-targets` leaves out a test target with `test = false`: the real
# engines' tests (tests/engines.rs), linted on their own.
cargo clippy --workspace --test engines --features xfer/rdma -- -D warnings
features=(--features xfer/rdma)
step "cargo test --no-run (with the rdma feature)"
log=$(mktemp)
engines_log=$(mktemp)
trap 'rm -f "$log" "$engines_log"; stop_dockerd' EXIT
status=0
cargo test --workspace "${features[@]}" --no-run
cargo test --workspace "${features[@]}" --test engines --no-run
step "run the tests"
# The real-engine tests (tests/engines.rs: vLLM, Ray, torch.distributed)
# run beside the rest: they use networks of their own and spend most of
# their minutes waiting on vLLM's start. Their output follows the rest's.
cargo test --workspace "${features[@]}" --test engines --no-fail-fast >"$engines_log" 2>&1 &
engines=$!
cargo test --workspace "${features[@]}" --no-fail-fast 2>&1 | tee "$log" || status=$?
step "the rest finished; waiting for tests/engines.rs"
wait "$engines" || status=1
step "tests/engines.rs (ran beside the rest)"
tee -a "$log" <"$engines_log"
echo "test.sh: $((SECONDS / 60)) min $((SECONDS % 60)) s in all"
# One closing line over all test binaries (cargo's own last line is the
# doc-test summary, which has no tests).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
