"""pipeline/scripts/tfx_env.sh without root or a Debian root: syntax, guards, `check`, `run`.

The guard functions run in isolation (``TFX_ENV_SOURCE_ONLY=1 source tfx_env.sh``) with `rm`
replaced by a function that only prints what it would delete, so a regression cannot delete
anything. Whole-script runs are limited to what cannot build a root: `check` (read-only), usage
errors, `run` refused before anything is built, and `run` in native mode with a prepared stamp
(and a PATH without apt-get, mmdebstrap, unshare, mount or chroot).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "pipeline" / "scripts" / "tfx_env.sh"
# The tools the script needs up to the point each test stops; nothing that installs or mounts.
SAFE_TOOLS = ["bash", "sh", "env", "realpath", "mktemp", "mkdir", "chmod", "ln", "rm", "cat",
              "dirname", "basename", "id", "ls", "stat", "flock", "grep", "head", "nice",
              "touch", "printf", "test", "cut", "md5sum", "ldd", "sleep", "readlink"]


@pytest.fixture
def safe_path(tmp_path):
    """A PATH directory with only SAFE_TOOLS (no apt-get, mmdebstrap, unshare, mount, chroot)."""
    bin_dir = tmp_path / "safe-bin"
    bin_dir.mkdir()
    for tool in SAFE_TOOLS:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def _env(tmp_path, **extra):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIAYN_TFX_", "PIP_INDEX", "PIP_EXTRA_INDEX", "PIP_TRUSTED"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), TMPDIR=str(tmp_path),
               PYTHON=shutil.which("python3") or "python3")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _source(snippet: str, tmp_path, **env) -> subprocess.CompletedProcess:
    """Sources the script's functions (nothing runs), fakes `rm`, then runs `snippet`."""
    program = ("TFX_ENV_SOURCE_ONLY=1 source \"$SCRIPT\"; set +eu\n"
               "rm() { echo \"RM $*\"; }\n" + snippet)
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60,
                          env=_env(tmp_path, SCRIPT=SCRIPT, **env))


def _script(args, tmp_path, cwd=None, path=None, **env) -> subprocess.CompletedProcess:
    environ = _env(tmp_path, **env)
    if path:
        environ["PATH"] = path
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60, env=environ, cwd=cwd or tmp_path)


def test_syntax():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_is_clean():
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout


# --- guards -------------------------------------------------------------------------------------

def test_safe_rm_root_refuses_anything_it_did_not_make(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".aiayn-tfx-owned").touch()  # even a marker does not make $HOME deletable
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious").touch()
    marked = tmp_path / "marked"
    marked.mkdir()
    (marked / ".aiayn-tfx-owned").touch()
    (tmp_path / "link").symlink_to(marked)
    cases = {"": "empty path", "/": "delete /", str(home): "$HOME or above it",
             str(tmp_path): "$HOME or above it", str(REPO): "the repository or above it",
             # (in a clone under /tmp, REPO.parent is above $HOME too: either reason)
             str(REPO.parent): "or above it",
             str(foreign): "did not make it", str(tmp_path / "link"): "symbolic link"}
    for target, why in cases.items():
        proc = _source(f'safe_rm_root "{target}"; echo "rc=$?"', tmp_path)
        assert "rc=1" in proc.stdout and "RM" not in proc.stdout, (target, proc.stdout)
        assert why in proc.stderr, (target, proc.stderr)
    proc = _source(f'safe_rm_root "{marked}"; echo "rc=$?"', tmp_path)
    assert f"RM -rf --one-file-system -- {marked}\nrc=0" in proc.stdout
    proc = _source(f'safe_rm_root "{tmp_path / "missing"}"; echo "rc=$?"', tmp_path)
    assert proc.stdout.strip() == "rc=0"


def test_safe_rm_root_deletes_what_it_made(tmp_path):
    legacy = tmp_path / "old-root"  # a root finished by an earlier version of the script
    (legacy / "usr").mkdir(parents=True)
    (legacy / ".aiayn-root-ok").touch()
    program = (f'TFX_ENV_SOURCE_ONLY=1 source "{SCRIPT}"; set +eu\n'
               f'safe_rm_root "{legacy}"; echo "rc=$?"')
    proc = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60,
                          env=_env(tmp_path))
    assert "rc=0" in proc.stdout and not legacy.exists()


def test_root_path_and_working_directory_checks(tmp_path):
    root = tmp_path / "root"
    snippet = "\n".join(
        [f'check_root_path "{p}"; echo "root {p or "EMPTY"} $?"'
         for p in ["", "/", "/var", str(tmp_path / "home"), str(REPO), str(root)]]
        + [f'check_workdir "{p}" "{root}"; echo "cwd {p} $?"'
           for p in ["/", str(root), str(root / "sub"), "/usr", "/etc", str(tmp_path / "proj")]])
    lines = dict(line.rsplit(" ", 1) for line in _source(snippet, tmp_path).stdout.splitlines())
    assert lines == {
        "root EMPTY": "1", "root /": "1", "root /var": "1", f"root {tmp_path / 'home'}": "1",
        f"root {REPO}": "1", f"root {root}": "0",
        "cwd /": "1", f"cwd {root}": "1", f"cwd {root / 'sub'}": "1", "cwd /usr": "1",
        "cwd /etc": "1", f"cwd {tmp_path / 'proj'}": "0"}


def test_mounts_below_a_directory_are_seen(tmp_path):
    proc = _source(f'has_mounts_below /proc; echo "proc $?"; has_mounts_below "{tmp_path}"; '
                   'echo "tmp $?"', tmp_path)
    assert proc.stdout.split("\n")[:2] == ["proc 0", "tmp 1"]


def test_shim_is_private_unpredictable_and_removed(tmp_path):
    proc = _source('unset -f rm; make_shim; a="$SHIM"; make_shim; b="$SHIM"\n'
                   'echo "$a"; echo "$b"; stat -c %a "$a"; readlink "$a/aiayn/pipeline"\n'
                   'cleanup; ls -d "$a" "$b" 2>/dev/null | wc -l', tmp_path)
    first, second, mode, link, left = proc.stdout.split()
    assert first != second and Path(first).parent == tmp_path
    assert Path(first).name.startswith("aiayn-tfx-shim.") and len(Path(first).name) > 20
    assert mode == "700" and link == str(REPO / "pipeline")
    assert left == "0"


def test_pip_index_settings_come_from_the_environment_not_a_copied_file(tmp_path):
    conf = tmp_path / "home" / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[global]\nindex-url = https://user:secret@pypi.example.invalid/simple\n")
    proc = _source("pip_index_env", tmp_path)
    lines = proc.stdout.split("\n")
    assert "PIP_INDEX_URL=https://user:secret@pypi.example.invalid/simple" in lines
    proc = _source("pip_index_env", tmp_path, PIP_INDEX_URL="https://mirror.example.invalid/")
    assert "PIP_INDEX_URL=https://mirror.example.invalid/" in proc.stdout.split("\n")
    # The script copies no pip configuration into the root.
    text = SCRIPT.read_text()
    assert not [line for line in text.splitlines() if "cp " in line and "pip" in line]


# --- the whole script: check, usage, refused runs, a native run -------------------------------

def test_check_native_and_root(tmp_path):
    venv = tmp_path / "venv"
    assert _script(["check"], tmp_path, AIAYN_TFX_MODE="native", AIAYN_TFX_VENV=venv
                   ).returncode == 1
    assert not venv.exists()  # check builds nothing
    venv.mkdir()
    (venv / ".aiayn-tfx-stamp").write_text("x")
    assert _script(["check"], tmp_path, AIAYN_TFX_MODE="native", AIAYN_TFX_VENV=venv
                   ).returncode == 0
    root = tmp_path / "root"
    assert _script(["check"], tmp_path, AIAYN_TFX_MODE="root", AIAYN_TFX_ROOT=root
                   ).returncode == 1
    assert not root.exists()
    stamp = root / "opt" / "aiayn-tfx-venv" / ".aiayn-tfx-stamp"
    stamp.parent.mkdir(parents=True)
    stamp.write_text("x")
    assert _script(["check"], tmp_path, AIAYN_TFX_MODE="root", AIAYN_TFX_ROOT=root
                   ).returncode == 0


@pytest.mark.parametrize("root", ["/", "HOME", "/var"])
def test_check_refuses_a_dangerous_root(tmp_path, root):
    root = str(tmp_path / "home") if root == "HOME" else root
    proc = _script(["check"], tmp_path, AIAYN_TFX_MODE="root", AIAYN_TFX_ROOT=root)
    assert proc.returncode == 2 and "refusing" in proc.stderr, proc.stderr


def test_usage_errors(tmp_path):
    assert _script([], tmp_path).returncode == 2
    assert _script(["run"], tmp_path, AIAYN_TFX_MODE="native").returncode == 2
    proc = _script(["check"], tmp_path, AIAYN_TFX_MODE="sideways")
    assert proc.returncode == 2 and "AIAYN_TFX_MODE must be" in proc.stderr


@pytest.mark.parametrize("where", ["/", "root"])
def test_run_in_the_root_refuses_to_bind_slash_or_the_root(tmp_path, safe_path, where):
    root = tmp_path / "root"
    (root / "inside").mkdir(parents=True)
    cwd = "/" if where == "/" else root / "inside"
    proc = _script(["run", "true"], tmp_path, cwd=cwd, path=safe_path, AIAYN_TFX_MODE="root",
                   AIAYN_TFX_ROOT=root)
    assert proc.returncode == 2, proc.stderr
    assert "refusing to run from" in proc.stderr
    assert not list(root.glob("opt")) and not list(tmp_path.glob("aiayn-tfx-shim.*"))


def test_native_run_passes_the_status_and_removes_the_shim(tmp_path, safe_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake_python = venv / "bin" / "python"  # would fail an install: a stale stamp cannot install
    fake_python.write_text("#!/bin/sh\nexit 1\n")
    fake_python.chmod(fake_python.stat().st_mode | stat.S_IEXEC)
    want = _source('printf \'%s\\n%s\\n\' "$PY_BASE" "$(requirements)"', tmp_path).stdout
    (venv / ".aiayn-tfx-stamp").write_text(want.rstrip("\n"))
    proc = _script(["run", "sh", "-c", 'echo "$PYTHONPATH"; ls "$PYTHONPATH/aiayn"; exit 7'],
                   tmp_path, path=safe_path, AIAYN_TFX_MODE="native", AIAYN_TFX_VENV=venv)
    assert proc.returncode == 7, proc.stderr
    shim = proc.stdout.split("\n")[0].split(":")[0]
    assert Path(shim).parent == tmp_path and proc.stdout.split()[1:] == [
        "export", "models", "pipeline"]
    assert not Path(shim).exists()  # removed by the exit trap


def _inner_namespace_script() -> str:
    """The script in_root runs inside the private mount namespace."""
    match = re.search(r"unshare --mount --propagation private bash -euc '(.*?)'\n}",
                      SCRIPT.read_text(), re.S)
    assert match, "in_root's namespace script not found"
    return match.group(1)


@pytest.mark.parametrize("fail_at, status", [("", 5), ("tmp", 32)])
def test_mounts_are_undone_last_first_whatever_fails(tmp_path, fail_at, status):
    """mount, umount and chroot are shell functions here: nothing is mounted for real."""
    root = tmp_path / "r"
    root.mkdir()
    driver = (
        'mount() { echo "MOUNT ${*: -1}"; [ "${*: -1}" != "$FAIL_AT" ] || return 32; }\n'
        'umount() { echo "UMOUNT ${*: -1}"; }\n'
        'chroot() { echo "CHROOT $1"; return 5; }\n'
        "export -f mount umount chroot\n"
        'bash -euc "$INNER"; echo "rc=$?"\n')
    env = _env(tmp_path, INNER=_inner_namespace_script(), AIAYN_ROOT=root,
               AIAYN_BINDS=f"{REPO}\n/tmp\n", AIAYN_CWD=str(REPO), AIAYN_CMD="true",
               FAIL_AT=f"{root}/{fail_at}" if fail_at else "")
    out = subprocess.run(["bash", "-c", driver], capture_output=True, text=True, timeout=60,
                         env=env).stdout.split("\n")
    mounted = [line.split(" ", 1)[1] for line in out if line.startswith("MOUNT ")]
    unmounted = [line.split(" ", 1)[1] for line in out if line.startswith("UMOUNT ")]
    succeeded = [m for m in mounted if m != env["FAIL_AT"]]
    assert succeeded and unmounted == succeeded[::-1], out
    assert ("CHROOT " + str(root) in out) == (not fail_at)
    assert f"rc={status}" in out
