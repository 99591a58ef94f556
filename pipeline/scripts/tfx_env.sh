#!/usr/bin/env bash
# An environment where TFX 1.21 installs, and a way to run commands in it.
#
#   bash pipeline/scripts/tfx_env.sh ensure          # build (or reuse) it; prints what it uses
#   bash pipeline/scripts/tfx_env.sh run CMD [ARG]...  # run CMD there, in the current directory
#   bash pipeline/scripts/tfx_env.sh check           # exit 0 if usable without building
#
# TFX 1.21's ml-metadata and tensorflow-data-validation wheels need glibc >= 2.38/2.39.
# - Native (glibc >= 2.39): a separate virtualenv, .venv-tfx/ (TFX pins protobuf<7 and
#   absl-py<2, so it stays apart from .venv).
# - Otherwise (e.g. Debian 12, glibc 2.36): a Debian 13 (trixie) root built with mmdebstrap
#   from the host's configured Debian mirror, cached in $AIAYN_TFX_ROOT (default
#   /var/cache/aiayn-tfx-root as root, else .tfx-root/), so a machine builds it once. The
#   host's Python (the base of .venv) is bind-mounted at its own path and a virtualenv is
#   created inside the root; the repository and /tmp are bind-mounted at their own paths, so
#   every path means the same inside and outside. Commands run in a private mount namespace
#   (unshare), so no mount outlives them.
# Both are idempotent: a stamp records the Python and the requirement list; a change rebuilds
# the virtualenv only. Requirements: the project's dependencies and its `tfx` extra, read
# from pyproject.toml. The project itself is put on PYTHONPATH (never installed), so the
# environment always runs the working tree's code.
#
# Exit status 3: neither path is possible here (no mmdebstrap and not installable); the
# message says why. Environment: AIAYN_TFX_ROOT, AIAYN_TFX_MIRROR (a Debian mirror URI),
# AIAYN_TFX_SUITE (default trixie), AIAYN_TFX_MODE (auto | native | root), PYTHON (the base
# interpreter; default: the base of .venv, else python3).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SUITE="${AIAYN_TFX_SUITE:-trixie}"
MODE="${AIAYN_TFX_MODE:-auto}"
NICE="nice -n ${AIAYN_TFX_NICE:-10}"
VENV_IN_ROOT=/opt/aiayn-tfx-venv
log() { echo "[tfx-env] $*" >&2; }
die() { local code="$1"; shift; echo "[tfx-env] error: $*" >&2; exit "$code"; }

base_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  if [ -x "$REPO/.venv/bin/python" ]; then
    "$REPO/.venv/bin/python" -c 'import sys, os; print(os.path.join(sys.base_prefix, "bin", "python3"))'
  else
    command -v python3
  fi
}
PY_BASE="$(base_python)"
PY_PREFIX="$("$PY_BASE" -c 'import sys; print(sys.base_prefix)')"

glibc_ok() {  # glibc >= 2.39 on this host?
  "$PY_BASE" - <<'EOF'
import os, sys
name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
sys.exit(0 if tuple(map(int, version.split(".")[:2])) >= (2, 39) else 1)
EOF
}

requirements() {  # the project's dependencies + its tfx extra, one per line
  "$PY_BASE" - "$REPO/pyproject.toml" <<'EOF'
import re, sys
try:
    import tomllib
    project = tomllib.load(open(sys.argv[1], "rb"))["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["tfx"]
except ImportError:  # Python 3.10: the two lists are simple enough to read directly
    text = open(sys.argv[1], encoding="utf-8").read()
    reqs = []
    for key in ("dependencies", "tfx"):
        body = re.search(r"^%s = \[(.*?)\]" % key, text, re.M | re.S).group(1)
        reqs += re.findall(r'"([^"]+)"', re.sub(r"#.*", "", body))
for req in reqs:
    print(req)
EOF
}

resolve_mode() {
  case "$MODE" in
    native|root) echo "$MODE" ;;
    auto) if glibc_ok; then echo native; else echo root; fi ;;
    *) die 2 "AIAYN_TFX_MODE must be auto, native or root; got '$MODE'." ;;
  esac
}

root_dir() {
  if [ -n "${AIAYN_TFX_ROOT:-}" ]; then echo "$AIAYN_TFX_ROOT"
  elif [ "$(id -u)" = 0 ]; then echo /var/cache/aiayn-tfx-root
  else echo "$REPO/.tfx-root"; fi
}

# The first Debian mirror the host's apt is configured with (deb822 .sources or one-line lists).
host_mirror() {
  if [ -n "${AIAYN_TFX_MIRROR:-}" ]; then echo "$AIAYN_TFX_MIRROR"; return; fi
  "$PY_BASE" - <<'EOF'
import glob, re
uris = []
for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in re.split(r"\n\s*\n", open(path).read()):
        fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M))
        if fields.get("Enabled", "yes").lower() == "no" or "deb" not in fields.get("Types", "").split():
            continue
        if any(s.endswith("-security") for s in fields.get("Suites", "").split()):
            continue
        if "debian-archive-keyring" in fields.get("Signed-By", "debian-archive-keyring"):
            uris += fields.get("URIs", "").split()
for path in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
        if m and not m.group(2).endswith("-security") and m.group(1).rstrip("/").endswith("/debian"):
            uris.append(m.group(1))
print(uris[0] if uris else "")
EOF
}

# --------------------------------------------------------------------------------------------
# Native: .venv-tfx
native_venv() { echo "${AIAYN_TFX_VENV:-$REPO/.venv-tfx}"; }

ensure_native() {
  local venv stamp want
  venv="$(native_venv)"
  want="$(printf '%s\n%s\n' "$PY_BASE" "$(requirements)")"
  stamp="$venv/.aiayn-tfx-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  mkdir -p "$venv"; exec 9>"$venv/.lock"; flock 9
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exec 9>&-; return; fi
  log "creating $venv (TFX installs natively: glibc >= 2.39)"
  [ -x "$venv/bin/python" ] || "$PY_BASE" -m venv "$venv"
  requirements > "$venv/requirements.txt"
  $NICE "$venv/bin/python" -m pip install --quiet -r "$venv/requirements.txt" 2>&1 \
    | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
  printf '%s' "$want" > "$stamp"
  exec 9>&-
}

# --------------------------------------------------------------------------------------------
# Debian 13 root
in_root() {  # in_root ROOT CMD...: runs CMD (a shell string) chrooted, with the bind mounts
  local root="$1"; shift
  local binds="$REPO /tmp" cwd
  cwd="$(pwd)"
  if [ "$PY_PREFIX" != "/usr" ]; then binds="$binds $PY_PREFIX"; fi
  case "$cwd/" in "$REPO"/*|/tmp/*) ;; *) binds="$binds $cwd" ;; esac
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  cp -L /etc/hosts "$root/etc/hosts" 2>/dev/null || true
  for f in /etc/pip.conf; do [ -f "$f" ] && cp -L "$f" "$root$f" || true; done
  mkdir -p "$root/root/.config/pip"
  [ -f "$HOME/.config/pip/pip.conf" ] && cp -L "$HOME/.config/pip/pip.conf" "$root/root/.config/pip/pip.conf"
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    mkdir -p "$root/etc/ssl/certs"; cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  fi
  AIAYN_ROOT="$root" AIAYN_BINDS="$binds" AIAYN_CWD="$cwd" AIAYN_CMD="$*" \
  unshare --mount --propagation private bash -euc '
    r="$AIAYN_ROOT"
    mount -t proc proc "$r/proc"
    mount --rbind /dev "$r/dev"
    mount --rbind /sys "$r/sys" 2>/dev/null || true
    for p in $AIAYN_BINDS; do mkdir -p "$r$p"; mount --rbind "$p" "$r$p"; done
    mkdir -p "$r$AIAYN_CWD"
    exec chroot "$r" /usr/bin/env -u LD_LIBRARY_PATH -u LD_PRELOAD -u PYTHONHOME -u VIRTUAL_ENV \
      HOME=/root \
      PATH=/opt/aiayn-tfx-venv/bin:/usr/local/bin:/usr/bin:/bin \
      /bin/bash -c "cd \"\$0\" && $AIAYN_CMD" "$AIAYN_CWD"'
}

ensure_root() {
  local root stamp want mirror
  root="$(root_dir)"
  if [ "$(id -u)" != 0 ]; then
    die 3 "TFX 1.21 needs glibc >= 2.39 (this host: $(ldd --version 2>&1 | head -1)); the Debian 13 root needs root (chroot, bind mounts). Run as root, or on a Debian 13 host."
  fi
  mkdir -p "$(dirname "$root")"
  exec 9>"$root.lock"; flock 9  # one builder at a time (make tfx and the tests may race)
  if [ ! -f "$root/.aiayn-root-ok" ]; then
    if ! command -v mmdebstrap >/dev/null; then
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing mmdebstrap"
        $NICE apt-get update -qq >&2 || true
        DEBIAN_FRONTEND=noninteractive $NICE apt-get install -y -qq --no-install-recommends mmdebstrap >&2 \
          || die 3 "mmdebstrap cannot be installed with apt-get here; TFX needs glibc >= 2.39 (this host: $(ldd --version | head -1))."
      else
        die 3 "TFX 1.21 needs glibc >= 2.39 (this host: $(ldd --version 2>&1 | head -1)) and mmdebstrap is not installed; as root: apt-get install mmdebstrap."
      fi
    fi
    mirror="$(host_mirror)"
    [ -n "$mirror" ] || die 3 "no Debian mirror in the host's apt sources; set AIAYN_TFX_MIRROR."
    log "building a Debian $SUITE root in $root from $mirror (about a minute)"
    rm -rf "$root.tmp"
    # g++: pyfarmhash (a tfx-bsl dependency) builds from source. The lib* packages are what a
    # bind-mounted CPython's extension modules link against (ssl, sqlite3, ctypes, bz2, lzma...).
    local pkgs="ca-certificates,g++,make,libssl3t64,libsqlite3-0,libffi8,zlib1g,libbz2-1.0,liblzma5,libreadline8t64,libncursesw6,libgdbm6t64,libuuid1,libexpat1"
    if [ "$PY_PREFIX" = "/usr" ]; then pkgs="$pkgs,python3,python3-venv,python3-dev"; fi
    $NICE mmdebstrap --variant=apt --include="$pkgs" "$SUITE" "$root.tmp" "deb $mirror $SUITE main" >&2 \
      || { rm -rf "$root.tmp"; die 1 "mmdebstrap failed (see above)."; }
    touch "$root.tmp/.aiayn-root-ok"
    rm -rf "$root"; mv "$root.tmp" "$root"
  fi
  local py="$PY_BASE"
  if [ "$PY_PREFIX" = "/usr" ]; then py=/usr/bin/python3; fi
  want="$(printf '%s\n%s\n' "$py" "$(requirements)")"
  stamp="$root$VENV_IN_ROOT/.aiayn-tfx-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exec 9>&-; return; fi
  log "installing TFX into $root$VENV_IN_ROOT (a few minutes the first time)"
  mkdir -p "$root$VENV_IN_ROOT"
  requirements > "$root$VENV_IN_ROOT/requirements.txt"
  in_root "$root" "set -eo pipefail; test -x $VENV_IN_ROOT/bin/python || $py -m venv $VENV_IN_ROOT; \
    $NICE $VENV_IN_ROOT/bin/python -m pip install --quiet --upgrade pip 2>&1 | { grep -v \"^WARNING: Location\" || true; } >&2; \
    $NICE $VENV_IN_ROOT/bin/python -m pip install --quiet -r $VENV_IN_ROOT/requirements.txt 2>&1 \
      | { grep -v \"^WARNING: Location '.*' is ignored\" || true; } >&2"
  printf '%s' "$want" > "$stamp"
  exec 9>&-
}

# The working tree on PYTHONPATH as the `aiayn` namespace package (aiayn.pipeline -> pipeline/).
shim_dir() {
  local d="/tmp/aiayn-tfx-shim-$(printf '%s' "$REPO" | md5sum | cut -c1-12)"
  mkdir -p "$d/aiayn"
  for pkg in pipeline models export; do ln -sfn "$REPO/$pkg" "$d/aiayn/$pkg"; done
  echo "$d"
}

quote_args() { local out="" a; for a in "$@"; do out="$out $(printf '%q' "$a")"; done; echo "$out"; }

cmd="${1:-}"; shift || true
case "$cmd" in
  ensure)
    mode="$(resolve_mode)"
    if [ "$mode" = native ]; then ensure_native; echo "native $(native_venv)"
    else ensure_root; echo "root $(root_dir)"; fi ;;
  check)
    mode="$(resolve_mode)"
    if [ "$mode" = native ]; then test -f "$(native_venv)/.aiayn-tfx-stamp"
    else test -f "$(root_dir)$VENV_IN_ROOT/.aiayn-tfx-stamp"; fi ;;
  run)
    [ $# -ge 1 ] || die 2 "usage: tfx_env.sh run CMD [ARG]..."
    mode="$(resolve_mode)"
    shim="$(shim_dir)"
    if [ "$mode" = native ]; then
      ensure_native
      venv="$(native_venv)"
      PATH="$venv/bin:$PATH" PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" "$@"
    else
      ensure_root
      in_root "$(root_dir)" "export PYTHONPATH=$shim; $(quote_args "$@")"
    fi ;;
  *) die 2 "usage: tfx_env.sh ensure | check | run CMD [ARG]..." ;;
esac
