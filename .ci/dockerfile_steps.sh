#!/usr/bin/env bash
# sandbox.Dockerfile's install steps, run on this Debian 12 machine: CI has no
# Docker engine, so it checks the image's recipe by doing the same here.
#
#   0. the build stage: the static Landlock prefix compiled with gcc alone (no
#      headers, no libc), from a folder holding only `workers`, by a bare python3;
#   1. apt-get install the image's packages: the one list is .ci/apt-packages.txt,
#      which the Dockerfile copies and installs (this script checks it still does);
#   2. pip install the project, non-editable, into a fresh virtualenv, from a
#      folder holding only what the Dockerfile copies (so a file the build needs
#      but the image lacks fails here);
#   3. the image's entry points answer: vessel-workers, the Celery app Flower
#      loads (celery -A broker.celery_app), tini;
#   4. bubblewrap works for a user without capabilities, as the image's `vessel`
#      user runs it (unprivileged user namespaces, a fresh procfs), with each
#      Landlock prefix: the static one where the image puts it, and Perl's.
#
# The host's own .venv is not touched. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

dockerfile=sandbox.Dockerfile
list=.ci/apt-packages.txt

if ! grep -q "^COPY $list " "$dockerfile"; then
  echo "dockerfile_steps: $dockerfile no longer installs from $list; keep the one list" >&2
  exit 1
fi

# --- 0. the build stage ----------------------------------------------------------
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
command -v gcc >/dev/null || {
  echo "dockerfile_steps: apt-get install gcc (the build stage's one package)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gcc >/dev/null
}
mkdir "$work/stage"
cp -r workers "$work/stage/"
(cd "$work/stage" && python3 -m workers.sandbox.command_prefix "$work/out/landlock-exec" >/dev/null)

# --- 1. system packages --------------------------------------------------------
mapfile -t packages < <(sed -e 's/#.*//' "$list" | tr -s ' \t' '\n' | sed '/^$/d')
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "dockerfile_steps: apt-get install ${packages[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  "${packages[@]}" >/dev/null

# --- 2. the project, as the image builds it ---------------------------------------
mkdir "$work/build"
# The Dockerfile's COPY lines into /build, in the same order.
cp pyproject.toml README.md "$work/build/"
cp -r broker workers "$work/build/"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "$work/build"
# COPY --from=landlock-prefix: into the virtualenv's libexec, where workers look.
static="$("$work/venv/bin/python" -c 'from workers.sandbox import command_prefix as c; print(c.default_path())')"
install -D -m 0755 "$work/out/landlock-exec" "$static"

# --- 3. the entry points the image and compose.yaml name ----------------------------
"$work/venv/bin/vessel-workers" --help >/dev/null
# The installed package carries every file the code reads that is not Python
# (admission's Lua scripts, the plugin runtime's JavaScript): the same as the tree.
repo="$PWD"
(cd "$work" && "$work/venv/bin/python" - "$repo" <<'PY'
import pathlib, sys
import broker, workers
tree = pathlib.Path(sys.argv[1])
for package, folder, pattern in (
    (broker, "admission/scripts", "*.lua"),
    (workers, "plugin/js", "*.*js"),
):
    installed = pathlib.Path(package.__file__).parent / folder
    want = sorted(str(p.relative_to(tree / package.__name__ / folder)) for p in (tree / package.__name__ / folder).rglob(pattern))
    have = sorted(str(p.relative_to(installed)) for p in installed.rglob(pattern))
    if want != have:
        sys.exit(f"dockerfile_steps: the installed {package.__name__}/{folder} holds {have}, the tree {want}")
PY
)
(cd "$work" && VESSEL_BROKER_URL=redis://127.0.0.1:6379/0 "$work/venv/bin/python" -c \
  'import celery, broker.celery_app as m; assert isinstance(m.app, celery.Celery)')
/usr/bin/tini --version >/dev/null

# --- 4. bubblewrap for a user without capabilities ------------------------------------
# It runs each Landlock prefix a call may start with (workers/sandbox/command_prefix.py:
# the static one bound where a call finds it; Perl's, /usr/bin/perl, Essential in
# Debian) in its report mode, then /bin/true; both lines must be the same.
mapfile -d '' perl < <(cd "$work" && "$work/venv/bin/python" -c \
  'import sys; from workers.sandbox import landlock as l
sys.stdout.write("".join(a + "\0" for a in (*l.COMMAND_PREFIX, l.REPORT_FLAG)))')
mount_at=/mnt/landlock-exec  # (the root here is the host's, read-only: no /.vessel to make)
flag="$(cd "$work" && "$work/venv/bin/python" -c 'from workers.sandbox import landlock as l; print(l.REPORT_FLAG)')"
chmod 0755 "$work"  # the unprivileged user binds the static prefix from under it
as_user=()
[ "$(id -u)" -ne 0 ] || as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all)
confined() {
  "${as_user[@]+"${as_user[@]}"}" \
    bwrap --unshare-all --die-with-parent --new-session --cap-drop ALL \
    --ro-bind / / --proc /proc --dev /dev --tmpfs /tmp --setenv TMPDIR /tmp \
    --tmpfs /mnt --ro-bind "$static" "$mount_at" \
    -- "$@" /bin/true | grep '^vessel-landlock: '
}
line_perl="$(confined "${perl[@]}")"
line_static="$(confined "$mount_at" "$flag")"
echo "$line_static" >&2
if [ "$line_perl" != "$line_static" ]; then
  echo "dockerfile_steps: the prefixes disagree: perl '$line_perl', static '$line_static'" >&2
  exit 1
fi
echo "dockerfile_steps: the image's install steps work here" >&2
