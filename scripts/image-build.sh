#!/usr/bin/env bash
# Build the Dockerfile's targets on a machine that reaches no registry, only its package indexes; each
# image is saved as an OCI archive that scripts/node.sh imports into each node's containerd.
#
#   scripts/image-build.sh                # the default target, `tessera`: extender, agent, device plugin,
#                                         # bridge; no ray, no torch
#   scripts/image-build.sh --target ray   # `ray`: tessera[ray] and the Dockerfile's ray[default] pin, for
#                                         # the Ray pods (torch: the package index's wheel, here the CPU one)
# Each prints one line: the image's name, its archive and its size in MiB; cached.
#
# What stands in for the Dockerfile's steps, and why:
#   * the base: instead of python:3.11-slim-bookworm (a registry image), a bookworm root file system
#     made by mmdebstrap from this machine's Debian sources (minbase + python3, python3-venv,
#     ca-certificates: Debian's Python 3.11). `docker build` keeps the registry base (PYTHON_IMAGE);
#   * the packages: downloaded on the host as wheels from this machine's Python package index, with
#     docker/constraints.txt (the Dockerfile's pins; the ray target adds docker/constraints-ray.txt and
#     the Dockerfile's own `ray[default]==` requirement, read from it), and installed in the image with no network
#     (`pip install --no-index`) into /opt/tessera, as the Dockerfile's build stage does. The package's wheel is
#     built from a copy of only what the Dockerfile copies (COPIED): from the whole checkout it would carry
#     testing/, the tests' and benches' helpers, which setup.cfg lists for the editable install;
#   * the rest as the Dockerfile's final stages: user and group 10001 (tessera), HOME=/tmp,
#     PYTHONDONTWRITEBYTECODE, PYTHONUNBUFFERED, entrypoint `tessera`, the target's ports.
# Cached: the base by its package list, the image by its requirements and a hash of what the Dockerfile
# copies (the package's sources, metadata and pins); rebuilt when one changes.
#
# Needs root, mmdebstrap and buildah (scripts/kube-build.sh installs them). Environment:
# TESSERA_IMAGE_CACHE (default ~/.cache/tessera/images), PYTHON (default the repo's .venv python).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${TESSERA_IMAGE_CACHE:-$HOME/.cache/tessera/images}
BASE_PACKAGES=python3,python3-venv,ca-certificates
PY=${PYTHON:-.venv/bin/python}
COPIED=(setup.cfg pyproject.toml README.md docker/constraints.txt extender gpu_sharing raybridge tessera_contract)

log() { printf '[image-build] %s\n' "$*" >&2; }
die() { printf '[image-build] ERROR: %s\n' "$*" >&2; exit 1; }

target=tessera
case "${1:-}:${2:-}" in
    ":") ;;
    --target:tessera | --target:ray) target=$2 ;;
    *) die "usage: scripts/image-build.sh [--target tessera|ray]" ;;
esac
[[ $# -eq 0 || $# -eq 2 ]] || die "usage: scripts/image-build.sh [--target tessera|ray]"
if [[ $target == tessera ]]; then
    IMAGE=docker.io/tessera/tessera:local
    REQUIREMENTS=("tessera[nvml]")  # the Dockerfile's build stage: the agent's NVML backend, no matplotlib
    CONSTRAINTS=(--constraint docker/constraints.txt)
    PORTS=(8888 8889 8890 9400 9401 9500)
else
    IMAGE=docker.io/tessera/tessera:local-ray
    # the Dockerfile's build-ray stage names the ray[default] pin: one source for it
    ray_pin=$(grep -o "'ray\[default\]==[0-9.]*'" Dockerfile | tr -d "'") \
        || die "the Dockerfile's build-ray stage no longer pins ray[default]==VERSION"
    REQUIREMENTS=("tessera[nvml,ray]" "$ray_pin")  # build-ray starts from the build stage's '.[nvml]'
    CONSTRAINTS=(--constraint docker/constraints.txt --constraint docker/constraints-ray.txt)
    COPIED+=(docker/constraints-ray.txt)
    PORTS=(9600)
fi

[[ $(id -u) -eq 0 ]] || die "needs root (mmdebstrap and buildah make a root file system and mounts)"
for b in mmdebstrap buildah; do
    command -v "$b" >/dev/null || die "$b not found: run scripts/kube-build.sh (it installs Debian's $b)"
done
[[ -x $PY ]] || PY=$(command -v python3) || die "no python to download the wheels with"
mkdir -p "$CACHE"

sources_hash() {
    find "${COPIED[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z \
        | xargs -0 sha256sum | sha256sum | cut -c1-16
}

# The base: keyed on the package list and this machine's Debian sources.
base=$CACHE/base-bookworm.tar
apt_sources() { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; }
base_key="$BASE_PACKAGES $(apt_sources | sha256sum | cut -c1-16)"
if [[ ! -f $base || $(cat "$base.key" 2>/dev/null) != "$base_key" ]]; then
    src=""
    for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do [[ -s $f ]] && { src=$f; break; }; done
    [[ -n $src ]] || die "no Debian apt sources on this machine for mmdebstrap"
    log "making the bookworm base with mmdebstrap (minbase + $BASE_PACKAGES) from $src"
    t=$(date +%s)
    # the target's extension picks mmdebstrap's output format: .tar
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" bookworm "$CACHE/base-bookworm.tmp.tar" "$src" \
        || die "mmdebstrap failed"
    mv -f "$CACHE/base-bookworm.tmp.tar" "$base"
    echo "$base_key" >"$base.key"
    log "base made in $(( $(date +%s) - t )) s: $(du -m "$base" | cut -f1) MiB"
fi

out=$CACHE/$target.tar
key="${REQUIREMENTS[*]} $(sources_hash) $(cat "$base.key")"
if [[ -f $out && $(cat "$out.key" 2>/dev/null) == "$key" ]]; then
    echo "$IMAGE $out $(du -m "$out" | cut -f1) MiB (cached)"
    exit 0
fi

t=$(date +%s)
work=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'buildah --storage-driver vfs --root "$work/root" --runroot "$work/run" rm --all >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
log "downloading the $target target's wheels (${CONSTRAINTS[*]}) from this machine's package index"
# the source tree's package under its own name, then the rest: `src[nvml,ray]` names the extras on the tree. The tree is
# what the Dockerfile copies and no more (no testing/, tests/ or bench/)
mkdir "$work/src"
cp -r --parents "${COPIED[@]}" "$work/src"
"$PY" -m pip wheel --quiet --wheel-dir "$work/wheels" "${CONSTRAINTS[@]}" "$work/src${REQUIREMENTS[0]#tessera}" \
    "${REQUIREMENTS[@]:1}" >"$work/pip.log" 2>&1 \
    || { tail -20 "$work/pip.log" >&2; die "pip wheel failed"; }

B=(buildah --storage-driver vfs --root "$work/root" --runroot "$work/run")
ctr=$("${B[@]}" from scratch)
mnt=$("${B[@]}" mount "$ctr")
tar -C "$mnt" -xf "$base"
cp -r "$work/wheels" "$mnt/tmp/wheels"
# install with no network, in the image's own Python (chroot: the image's paths and interpreter)
chroot "$mnt" /usr/bin/python3 -m venv /opt/tessera
chroot "$mnt" /opt/tessera/bin/pip install --quiet --no-index --no-cache-dir --disable-pip-version-check \
    --find-links /tmp/wheels "${REQUIREMENTS[@]}" >"$work/install.log" 2>&1 || { tail -20 "$work/install.log" >&2; die "pip install in the image failed"; }
rm -rf "$mnt/tmp/wheels" "$mnt/var/cache/apt/"*.bin "$mnt/var/lib/apt/lists/"*
find "$mnt/opt/tessera" -name __pycache__ -type d -prune -exec rm -rf {} +
echo 'tessera:x:10001:10001:tessera:/nonexistent:/usr/sbin/nologin' >>"$mnt/etc/passwd"
echo 'tessera:x:10001:' >>"$mnt/etc/group"
"${B[@]}" umount "$ctr" >/dev/null
"${B[@]}" config --user 10001:10001 --workingdir /tmp --entrypoint '["tessera"]' --cmd '--help' \
    --env PATH=/opt/tessera/bin:/usr/local/bin:/usr/bin:/bin --env PYTHONDONTWRITEBYTECODE=1 \
    --env PYTHONUNBUFFERED=1 --env HOME=/tmp \
    "${PORTS[@]/#/--port=}" "$ctr"
"${B[@]}" commit --quiet "$ctr" "$IMAGE" >/dev/null
"${B[@]}" push --quiet "$IMAGE" "oci-archive:$out.tmp:$IMAGE"
mv -f "$out.tmp" "$out"
echo "$key" >"$out.key"
log "built in $(( $(date +%s) - t )) s"
echo "$IMAGE $out $(du -m "$out" | cut -f1) MiB"
