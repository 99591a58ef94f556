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
#   (unshare), so no mount outlives them; the mounts are also undone, last first, when the
#   command ends or a mount fails.
# Both are idempotent: a stamp records the Python and the requirement list; a change rebuilds
# the virtualenv only. Requirements: the project's dependencies and its `tfx` extra, read
# from pyproject.toml. The project itself is put on PYTHONPATH (never installed), so the
# environment always runs the working tree's code: through a private shim directory
# (mktemp -d, mode 0700, removed on exit).
#
# Safety: the script deletes only directories it made itself (they hold its marker file
# .aiayn-tfx-owned), never an empty path, /, $HOME or an ancestor of the repository or $HOME,
# and nothing with a mount below it. It never copies credentials into the root: pip's index
# settings (index-url, extra-index-url, trusted-host, from PIP_* or the host's pip.conf) reach
# the install command through its environment only. It refuses to run from / or from inside
# the root (that directory would be bind-mounted into the root).
#
# Exit status 3: neither path is possible here (no mmdebstrap and not installable); the
# message says why. Exit status 2: a usage or path error. Environment: AIAYN_TFX_ROOT,
# AIAYN_TFX_MIRROR (a Debian mirror URI), AIAYN_TFX_SUITE (default trixie), AIAYN_TFX_MODE
# (auto | native | root), AIAYN_TFX_VENV, PYTHON (the base interpreter; default: the base of
# .venv, else python3). TFX_ENV_SOURCE_ONLY=1 when sourcing defines the functions and stops
# (for tests of the guards).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SUITE="${AIAYN_TFX_SUITE:-trixie}"
MODE="${AIAYN_TFX_MODE:-auto}"
NICE="nice -n ${AIAYN_TFX_NICE:-10}"
VENV_IN_ROOT=/opt/aiayn-tfx-venv
# Written by this script into every directory it creates and may later delete.
MARKER=.aiayn-tfx-owned
# What an earlier version of this script wrote into a finished root (also ours).
ROOT_OK=.aiayn-root-ok
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

# --------------------------------------------------------------------------------------------
# Guards (no side effects except safe_rm_root's deletion; each prints why it refuses)

abspath() { realpath -m -- "$1"; }

# is_ancestor_or_same A B: A is B or a directory above it (both absolute, normalised).
is_ancestor_or_same() { [ "$1" = "$2" ] || [ "$1" = / ] || case "$2/" in "$1"/*) true ;; *) false ;; esac; }

# check_root_path PATH: may PATH serve as the Debian root (created, rebuilt, deleted)?
check_root_path() {
  local p="${1:-}" abs home
  if [ -z "$p" ]; then echo "[tfx-env] refusing: the root path is empty" >&2; return 1; fi
  abs="$(abspath "$p")"
  home="$(abspath "${HOME:-/}")"
  if [ "$abs" = / ]; then
    echo "[tfx-env] refusing: the root path '$p' is /; set AIAYN_TFX_ROOT to a dedicated directory such as /var/cache/aiayn-tfx-root" >&2; return 1
  fi
  case "${abs#/}" in
    */*) ;;
    *) echo "[tfx-env] refusing: the root path '$p' is a top-level directory; use a dedicated directory below one, such as /var/cache/aiayn-tfx-root" >&2; return 1 ;;
  esac
  if is_ancestor_or_same "$abs" "$home"; then
    echo "[tfx-env] refusing: the root path '$p' is \$HOME or above it; use a dedicated directory" >&2; return 1
  fi
  if is_ancestor_or_same "$abs" "$REPO"; then
    echo "[tfx-env] refusing: the root path '$p' is the repository or above it; use a dedicated directory" >&2; return 1
  fi
}

# has_mounts_below DIR: is anything mounted at DIR or below it?
has_mounts_below() {
  local dir="$1" mnt
  [ -r /proc/self/mounts ] || return 1
  while read -r _ mnt _; do
    mnt="$(printf '%b' "$mnt")"  # /proc/self/mounts escapes spaces as \040
    if [ "$mnt" = "$dir" ] || case "$mnt" in "$dir"/*) true ;; *) false ;; esac; then return 0; fi
  done < /proc/self/mounts
  return 1
}

# safe_rm_root DIR: deletes DIR only when this script made it (it holds $MARKER, or $ROOT_OK
# from an earlier version), it is not an empty path, /, $HOME or above $HOME or the
# repository, not a symlink, and nothing is mounted below it. A missing DIR is fine.
safe_rm_root() {
  local p="${1:-}" abs
  if [ -z "$p" ]; then echo "[tfx-env] refusing to delete an empty path" >&2; return 1; fi
  abs="$(abspath "$p")"
  if [ "$abs" = / ]; then echo "[tfx-env] refusing to delete /" >&2; return 1; fi
  if is_ancestor_or_same "$abs" "$(abspath "${HOME:-/}")"; then
    echo "[tfx-env] refusing to delete '$p': it is \$HOME or above it" >&2; return 1
  fi
  if is_ancestor_or_same "$abs" "$REPO"; then
    echo "[tfx-env] refusing to delete '$p': it is the repository or above it" >&2; return 1
  fi
  if [ -L "$p" ]; then echo "[tfx-env] refusing to delete '$p': it is a symbolic link" >&2; return 1; fi
  [ -e "$abs" ] || return 0
  if [ ! -d "$abs" ]; then echo "[tfx-env] refusing to delete '$p': not a directory" >&2; return 1; fi
  if [ ! -f "$abs/$MARKER" ] && [ ! -f "$abs/$ROOT_OK" ]; then
    echo "[tfx-env] refusing to delete '$p': this script did not make it (no $MARKER in it); remove it yourself if it is yours to remove" >&2; return 1
  fi
  if has_mounts_below "$abs"; then
    echo "[tfx-env] refusing to delete '$p': something is mounted below it (umount -R it first)" >&2; return 1
  fi
  rm -rf --one-file-system -- "$abs"
}

# System directories a bind mount would shadow in the root (the root's own Debian 13 files).
SYSTEM_DIRS="/bin /boot /dev /etc /lib /lib32 /lib64 /libx32 /opt /proc /root /run /sbin /sys /usr /var"

# check_workdir CWD ROOT: may CWD be bind-mounted into ROOT (run's working directory)? Not /,
# not the root or a directory inside it, not a system directory such as /usr or /etc.
check_workdir() {
  local cwd root d
  cwd="$(abspath "$1")"; root="$(abspath "$2")"
  if [ "$cwd" = / ]; then
    echo "[tfx-env] refusing to run from /: the working directory is bind-mounted into the root, and / would put the whole host there; cd to a project directory first" >&2; return 1
  fi
  if is_ancestor_or_same "$root" "$cwd"; then
    echo "[tfx-env] refusing to run from '$1': it is the Debian root '$2' or inside it; cd to a project directory first" >&2; return 1
  fi
  for d in $SYSTEM_DIRS; do
    if [ "$cwd" = "$d" ]; then
      echo "[tfx-env] refusing to run from '$1': bind-mounted into the root it would hide the root's own $d; cd to a project directory first" >&2; return 1
    fi
  done
}

# --------------------------------------------------------------------------------------------
# Temporary directories: private (mktemp -d: mode 0700, an unpredictable name), removed on exit.
CLEANUP_DIRS=()
cleanup() {
  local d
  for d in ${CLEANUP_DIRS[@]+"${CLEANUP_DIRS[@]}"}; do
    case "$d" in
      */aiayn-tfx-shim.*) rm -rf -- "$d" ;;  # our mktemp -d: symlinks only
      *) safe_rm_root "$d" || true ;;
    esac
  done
}

# The working tree on PYTHONPATH as the `aiayn` namespace package (aiayn.pipeline -> pipeline/).
make_shim() {
  local d
  d="$(mktemp -d "${TMPDIR:-/tmp}/aiayn-tfx-shim.XXXXXXXXXX")"
  CLEANUP_DIRS+=("$d")
  chmod 700 "$d"
  mkdir "$d/aiayn"
  for pkg in pipeline models export; do ln -s "$REPO/$pkg" "$d/aiayn/$pkg"; done
  SHIM="$d"
}

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

# pip's index settings for the install command: NAME=VALUE lines (PIP_INDEX_URL,
# PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST) from the environment, else from the host's pip
# configuration files ([global], then [install]). Passed in the environment of the install
# only; never written into the root.
pip_index_env() {
  "$PY_BASE" - <<'EOF'
import configparser, os
keys = {"index-url": "PIP_INDEX_URL", "extra-index-url": "PIP_EXTRA_INDEX_URL",
        "trusted-host": "PIP_TRUSTED_HOST"}
home = os.path.expanduser("~")
files = ["/etc/xdg/pip/pip.conf", "/etc/pip.conf", os.path.join(home, ".pip", "pip.conf"),
         os.path.join(os.environ.get("XDG_CONFIG_HOME", os.path.join(home, ".config")), "pip",
                      "pip.conf")]
if os.environ.get("PIP_CONFIG_FILE"):
    files.append(os.environ["PIP_CONFIG_FILE"])
found = {}
for path in files:
    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        continue
    for section in ("global", "install"):
        if parser.has_section(section):
            for key, env in keys.items():
                if parser.has_option(section, key):
                    found[env] = " ".join(parser.get(section, key).split())
for env in keys.values():
    value = os.environ.get(env) or found.get(env)
    if value and "\n" not in value:
        print(f"{env}={value}")
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
  local root
  if [ -n "${AIAYN_TFX_ROOT:-}" ]; then root="$AIAYN_TFX_ROOT"
  elif [ "$(id -u)" = 0 ]; then root=/var/cache/aiayn-tfx-root
  else root="$REPO/.tfx-root"; fi
  check_root_path "$root" || exit 2
  abspath "$root"
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
  local binds cwd p
  cwd="$(pwd -P)"
  check_workdir "$cwd" "$root" || exit 2
  binds="$(printf '%s\n%s\n' "$REPO" /tmp)"
  if [ "$PY_PREFIX" != "/usr" ]; then binds="$(printf '%s\n%s\n' "$binds" "$PY_PREFIX")"; fi
  case "$cwd/" in "$REPO"/*|/tmp/*) ;; *) binds="$(printf '%s\n%s\n' "$binds" "$cwd")" ;; esac
  case "${SHIM:-/tmp/}" in /tmp/*) ;; *) binds="$(printf '%s\n%s\n' "$binds" "$SHIM")" ;; esac
  while IFS= read -r p; do  # never / (it would put the whole host into the root), never the root
    [ -n "$p" ] || continue
    if [ "$(abspath "$p")" = / ] || is_ancestor_or_same "$root" "$(abspath "$p")"; then
      die 2 "refusing to bind-mount '$p' into the root $root (it is /, the root or inside it)."
    fi
  done <<< "$binds"
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  cp -L /etc/hosts "$root/etc/hosts" 2>/dev/null || true
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then  # public CA certificates, no secrets
    mkdir -p "$root/etc/ssl/certs"; cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  fi
  # shellcheck disable=SC2016  # expanded by the inner shell, inside the namespace
  AIAYN_ROOT="$root" AIAYN_BINDS="$binds" AIAYN_CWD="$cwd" AIAYN_CMD="$*" \
  unshare --mount --propagation private bash -euc '
    r="$AIAYN_ROOT"
    mounted=()
    undo() {  # unmount what was mounted, last first (also when a mount or the command fails)
      local rc=$? i
      for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount -R "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" 2>/dev/null || true
      done
      exit "$rc"
    }
    trap undo EXIT
    trap "exit 130" INT
    trap "exit 143" TERM
    mnt() { local target="${*: -1}"; mount "$@" || return; mounted+=("$target"); }
    mnt -t proc proc "$r/proc"
    mnt --rbind /dev "$r/dev"
    mnt --rbind /sys "$r/sys" 2>/dev/null || true
    while IFS= read -r p; do
      [ -n "$p" ] || continue
      mkdir -p "$r$p"; mnt --rbind "$p" "$r$p"
    done <<< "$AIAYN_BINDS"
    mkdir -p "$r$AIAYN_CWD"
    rc=0
    chroot "$r" /usr/bin/env -u LD_LIBRARY_PATH -u LD_PRELOAD -u PYTHONHOME -u VIRTUAL_ENV \
      -u AIAYN_ROOT -u AIAYN_BINDS -u AIAYN_CWD -u AIAYN_CMD \
      HOME=/root \
      PATH=/opt/aiayn-tfx-venv/bin:/usr/local/bin:/usr/bin:/bin \
      /bin/bash -c "cd \"\$0\" && $AIAYN_CMD" "$AIAYN_CWD" || rc=$?
    exit "$rc"'
}

# build_root ROOT: a fresh Debian root at ROOT, built in a private staging directory beside it
# and moved into place; a failed build leaves nothing behind.
build_root() {
  local root="$1" mirror staging pkgs
  mirror="$(host_mirror)"
  [ -n "$mirror" ] || die 3 "no Debian mirror in the host's apt sources; set AIAYN_TFX_MIRROR."
  if [ -e "$root" ] || [ -L "$root" ]; then  # an unfinished or foreign directory in the way
    if [ -d "$root" ] && [ ! -L "$root" ] && [ -z "$(ls -A "$root")" ]; then
      rmdir "$root"
    else
      safe_rm_root "$root" || die 2 "$root is in the way of the Debian root and was not made by this script; remove it, or set AIAYN_TFX_ROOT to another directory."
    fi
  fi
  staging="$(mktemp -d "$(dirname "$root")/.$(basename "$root").build.XXXXXXXX")"
  touch "$staging/$MARKER"
  CLEANUP_DIRS+=("$staging")
  log "building a Debian $SUITE root in $root from $mirror (about a minute)"
  # g++: pyfarmhash (a tfx-bsl dependency) builds from source. The lib* packages are what a
  # bind-mounted CPython's extension modules link against (ssl, sqlite3, ctypes, bz2, lzma...).
  pkgs="ca-certificates,g++,make,libssl3t64,libsqlite3-0,libffi8,zlib1g,libbz2-1.0,liblzma5,libreadline8t64,libncursesw6,libgdbm6t64,libuuid1,libexpat1"
  if [ "$PY_PREFIX" = "/usr" ]; then pkgs="$pkgs,python3,python3-venv,python3-dev"; fi
  $NICE mmdebstrap --variant=apt --include="$pkgs" "$SUITE" "$staging/root" "deb $mirror $SUITE main" >&2 \
    || die 1 "mmdebstrap failed (see above)."
  touch "$staging/root/$MARKER" "$staging/root/$ROOT_OK"
  mv "$staging/root" "$root"
  safe_rm_root "$staging" || true
}

ensure_root() {
  local root stamp want
  root="$(root_dir)"
  if [ "$(id -u)" != 0 ]; then
    die 3 "TFX 1.21 needs glibc >= 2.39 (this host: $(ldd --version 2>&1 | head -1)); the Debian 13 root needs root (chroot, bind mounts). Run as root, or on a Debian 13 host."
  fi
  mkdir -p "$(dirname "$root")"
  exec 9>"$root.lock"; flock 9  # one builder at a time (make tfx and the tests may race)
  if [ ! -f "$root/$ROOT_OK" ]; then
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
    build_root "$root"
  fi
  local py="$PY_BASE"
  if [ "$PY_PREFIX" = "/usr" ]; then py=/usr/bin/python3; fi
  want="$(printf '%s\n%s\n' "$py" "$(requirements)")"
  stamp="$root$VENV_IN_ROOT/.aiayn-tfx-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exec 9>&-; return; fi
  log "installing TFX into $root$VENV_IN_ROOT (a few minutes the first time)"
  mkdir -p "$root$VENV_IN_ROOT"
  requirements > "$root$VENV_IN_ROOT/requirements.txt"
  # pip's index settings: in this command's environment only (a subshell), never in the root.
  (
    while IFS= read -r kv; do
      [ -n "$kv" ] && export "${kv?}"
    done < <(pip_index_env)
    in_root "$root" "set -eo pipefail; test -x $VENV_IN_ROOT/bin/python || $py -m venv $VENV_IN_ROOT; \
      $NICE $VENV_IN_ROOT/bin/python -m pip install --quiet --upgrade pip 2>&1 | { grep -v \"^WARNING: Location\" || true; } >&2; \
      $NICE $VENV_IN_ROOT/bin/python -m pip install --quiet -r $VENV_IN_ROOT/requirements.txt 2>&1 \
        | { grep -v \"^WARNING: Location '.*' is ignored\" || true; } >&2"
  )
  printf '%s' "$want" > "$stamp"
  exec 9>&-
}

quote_args() { local out="" a; for a in "$@"; do out="$out $(printf '%q' "$a")"; done; echo "$out"; }

# shellcheck disable=SC2317  # `exit` when executed rather than sourced
if [ "${TFX_ENV_SOURCE_ONLY:-}" = 1 ]; then return 0 2>/dev/null || exit 0; fi

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cmd="${1:-}"; shift || true
case "$cmd" in
  ensure)
    mode="$(resolve_mode)"
    if [ "$mode" = native ]; then ensure_native; echo "native $(native_venv)"
    else ensure_root; echo "root $(root_dir)"; fi ;;
  check)
    mode="$(resolve_mode)"
    if [ "$mode" = native ]; then test -f "$(native_venv)/.aiayn-tfx-stamp"
    else root="$(root_dir)"; test -f "$root$VENV_IN_ROOT/.aiayn-tfx-stamp"; fi ;;
  run)
    [ $# -ge 1 ] || die 2 "usage: tfx_env.sh run CMD [ARG]..."
    mode="$(resolve_mode)"
    make_shim
    if [ "$mode" = native ]; then
      ensure_native
      venv="$(native_venv)"
      PATH="$venv/bin:$PATH" PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" "$@"
    else
      root="$(root_dir)"
      check_workdir "$(pwd -P)" "$root" || exit 2
      ensure_root
      in_root "$root" "export PYTHONPATH=$(printf '%q' "$SHIM"); $(quote_args "$@")"
    fi ;;
  *) die 2 "usage: tfx_env.sh ensure | check | run CMD [ARG]..." ;;
esac
