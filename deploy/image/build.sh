#!/usr/bin/env bash
# The jevany-daemon container image, built with no registry: a Debian root filesystem made from the
# distribution's packages (mmdebstrap), the project installed into /opt/jevany from wheels, written as
# an OCI image layout (umoci) that skopeo, podman or a registry push takes as it is.
#
#   deploy/image/build.sh                       # CPU: Debian bookworm, Python 3.11, the CPU torch pin
#   deploy/image/build.sh --base cuda-layout:12.8 --wheels wheelhouse --flavour cuda
#                                               # GPU: the same steps on a CUDA base (docs/ACROSS-HOSTS.md)
#
# Options:
#   --out DIR        the OCI layout written (default dist/image; replaced)
#   --flavour NAME   the tag's suffix: jevany-daemon:VERSION-NAME (default cpu)
#   --wheels DIR     wheels to install from, nothing else (default: built here with constraints-cpu.txt)
#   --base LAYOUT:TAG  start from this OCI image (its root filesystem unpacked) instead of Debian
#   --extras LIST    jevany-daemon's extras installed (default multimodal; a GPU image: gpu)
#   --mirror URL     the Debian mirror for the CPU base (default http://deb.debian.org/debian)
#
# Needs root (the root filesystem holds files of several owners), mmdebstrap and umoci (installed
# from the distribution's packages where apt-get is there; else: apt-get install mmdebstrap umoci), and
# the package mirror and the package index pip uses (the wheels, unless --wheels). The image runs as uid 10001 (jevany), its entry point the daemon
# (`jevany-daemon serve ...` as the manifests pass it), /opt/jevany/bin first on PATH (jevany-ctl for
# the preStop drain), /run/jevany and /var/cache/jevany its own. Every file's time is the last
# commit's (SOURCE_DATE_EPOCH) and Python's bytecode is hashed, not stamped: the moment of the build
# leaves no mark in its files.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/dist/image
FLAVOUR=cpu
WHEELS=
BASE=
EXTRAS=multimodal
MIRROR=http://deb.debian.org/debian
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$(realpath -m "$2"); shift 2 ;;
        --flavour) FLAVOUR=$2; shift 2 ;;
        --wheels) WHEELS=$(realpath "$2"); shift 2 ;;
        --base) BASE=$2; shift 2 ;;
        --extras) EXTRAS=$2; shift 2 ;;
        --mirror) MIRROR=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
    esac
done

need=()
[ -n "$BASE" ] || command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v umoci >/dev/null 2>&1 || need+=(umoci)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "tools: installing ${need[*]} from the distribution's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
             --no-install-recommends "${need[@]}" >/dev/null 2>&1; } || true
    still=()
    for tool in "${need[@]}"; do command -v "$tool" >/dev/null 2>&1 || still+=("$tool"); done
    need=("${still[@]}")
fi
if [ ${#need[@]} -gt 0 ]; then
    echo "build.sh: ${need[*]} not found (Debian: apt-get install ${need[*]})" >&2
    exit 3
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "build.sh: run as root: the root filesystem holds files of several owners" >&2
    exit 3
fi

VERSION=$("$ROOT/.venv/bin/python" -c "import jevany_daemon; print(jevany_daemon.__version__)" 2>/dev/null \
          || python3 -c "import tomllib; print(tomllib.load(open('$ROOT/pyproject.toml','rb'))['project']['version'])")
TAG=$VERSION-$FLAVOUR           # the layout's reference: jevany-daemon:TAG once pushed
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)}
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jevany-image.XXXXXX")
trap 'umount "$WORK/bundle/rootfs/proc" 2>/dev/null || true; rm -rf --one-file-system "$WORK"' EXIT
started=$SECONDS

if [ -z "$WHEELS" ]; then
    WHEELS=$WORK/wheels
    echo "wheels: the project and its pins (constraints-cpu.txt: the CPU torch)"
    python="$ROOT/.venv/bin/python"
    [ -x "$python" ] || python=python3
    "$python" -m pip wheel --quiet --disable-pip-version-check -c "$ROOT/constraints-cpu.txt" -w "$WHEELS" \
        "$ROOT/client" "$ROOT[multimodal]"
fi

rm -rf "$OUT"
mkdir -p "$(dirname "$OUT")"
umoci init --layout "$OUT"
umoci new --image "$OUT:$TAG"
umoci unpack --image "$OUT:$TAG" "$WORK/bundle" >/dev/null      # empty: the whole tree becomes one layer
rmdir "$WORK/bundle/rootfs"
base_env=()
if [ -n "$BASE" ]; then
    echo "root filesystem: $BASE"
    umoci unpack --image "$BASE" "$WORK/base" >/dev/null
    mv "$WORK/base/rootfs" "$WORK/bundle/rootfs"
    # The base's environment (a CUDA image's NVIDIA_* and library paths) is kept, PATH put after ours.
    while IFS= read -r line; do base_env+=(--config.env "$line"); done < <(python3 - "$WORK/base/config.json" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["process"].get("env", []):
    if not item.startswith(("PATH=", "HOME=")):
        print(item)
PY
)
else
    echo "root filesystem: Debian bookworm from $MIRROR"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$WORK/bundle/rootfs" "$MIRROR"
fi
rootfs=$WORK/bundle/rootfs

echo "install: /opt/jevany from $(ls "$WHEELS" | wc -l) wheels"
mkdir -p "$rootfs/tmp/wheels" "$rootfs/proc"
cp "$WHEELS"/*.whl "$rootfs/tmp/wheels/"
mount --bind /proc "$rootfs/proc"
in_root() { chroot "$rootfs" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
if ! in_root sh -c 'command -v python3' >/dev/null; then
    # A CUDA base brings no Python: the distribution's, with venv.
    in_root sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        python3 python3-venv ca-certificates && rm -rf /var/lib/apt/lists/*' >/dev/null
fi
in_root python3 -m venv /opt/jevany
in_root /opt/jevany/bin/pip install --quiet --no-index --no-compile --no-cache-dir --disable-pip-version-check \
    --find-links /tmp/wheels "jevany-daemon[$EXTRAS]" jevany-client
in_root /opt/jevany/bin/pip uninstall --quiet --yes pip setuptools 2>/dev/null || true   # no installer at run time
in_root useradd --uid 10001 --user-group --home-dir /var/lib/jevany --create-home --shell /usr/sbin/nologin jevany
install -d -o 10001 -g 10001 -m 0750 "$rootfs/run/jevany" "$rootfs/var/cache/jevany"
# Bytecode checked by the source's hash, so its header holds no time and the non-root user never
# has to write it. A package may ship a file that is not Python 3 on purpose (a template, a test
# fixture): compileall then says so and exits 1, which is no reason to stop.
in_root /opt/jevany/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/jevany/lib \
    >/dev/null 2>&1 || true
umount "$rootfs/proc"
rm -rf "$rootfs/tmp/wheels" "$rootfs/root/.cache"
find "$rootfs" -depth -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

echo "layers: $OUT:$TAG"
umoci repack --image "$OUT:$TAG" --history.created "$CREATED" \
    --history.created_by "deploy/image/build.sh ($FLAVOUR)" "$WORK/bundle" >/dev/null
umoci config --image "$OUT:$TAG" --created "$CREATED" --history.created "$CREATED" \
    --history.created_by "deploy/image/build.sh: the daemon's settings" \
    --config.user 10001:10001 --config.workingdir /var/lib/jevany \
    --config.entrypoint /opt/jevany/bin/jevany-daemon --config.cmd=--help "${base_env[@]}" \
    --config.env PATH=/opt/jevany/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env HOME=/var/lib/jevany --config.env PYTHONDONTWRITEBYTECODE=1 \
    --config.exposedports 5555/tcp --config.exposedports 8000/tcp --config.stopsignal SIGTERM \
    --config.label org.opencontainers.image.title=jevany-daemon \
    --config.label "org.opencontainers.image.version=$VERSION" >/dev/null
umoci gc --layout "$OUT"

digest=$(python3 -c "import json,sys; idx=json.load(open(sys.argv[1])); \
print(next(m['digest'] for m in idx['manifests'] if m.get('annotations',{}).get('org.opencontainers.image.ref.name')==sys.argv[2]))" \
    "$OUT/index.json" "$TAG")
echo "$digest" >"$OUT/digest"
echo "image: $OUT:$TAG  $digest  $(du -sh "$OUT" | cut -f1) in $((SECONDS - started)) s"
echo "push:  skopeo copy oci:$OUT:$TAG docker://REGISTRY/jevany-daemon:$TAG"
