#!/usr/bin/env bash
# Build kube-apiserver, kube-scheduler, kube-controller-manager, kubelet and kube-proxy v1.20.2 from
# Debian's `kubernetes` source package and cache them; make sure etcd (Debian etcd-server) is there.
#
# Idempotent: when the cached binaries exist, `--version` prints v1.20.2 and the
# cache's `recipe` stamp names this script's RECIPE, nothing is built.
# See scripts/CONTROLPLANE.md.
#
# Environment:
#   TESSERA_KUBE_CACHE  cache dir  (default ~/.cache/tessera/kube-v1.20.2-r4)
#   TESSERA_BUILD_ROOT  build root (default ~/.cache/tessera/build)
#   KEEP_BUILD=1        keep the source tree after the build (default: delete)
#   SKIP_KUBECTL=1      do not fetch Debian's kubectl 1.20 (kubernetes-client)
set -euo pipefail

KUBE_VERSION=v1.20.2
# RECIPE names how the binaries are built; bump it (and the default cache dir, so
# binaries that others are using are never overwritten) whenever the build changes.
#   r1 (cache kube-v1.20.2):    the Debian tree as shipped; its vendored reflect2 v1.0.1
#                               makes the apiserver segfault on custom resources.
#   r2 (cache kube-v1.20.2-r2): vendored reflect2 replaced by Debian's v1.0.2.
#   r3 (cache kube-v1.20.2-r3): kube-controller-manager from the same tree too (Jobs,
#                               Deployments, ReplicaSets: the gang Job example needs them).
#   r4 (cache kube-v1.20.2-r4): kubelet and kube-proxy from the same tree too (real nodes:
#                               scripts/node.sh, issue 34).
RECIPE=r4
CACHE_DIR=${TESSERA_KUBE_CACHE:-$HOME/.cache/tessera/kube-$KUBE_VERSION-$RECIPE}
BIN_DIR=$CACHE_DIR/bin
BUILD_ROOT=${TESSERA_BUILD_ROOT:-$HOME/.cache/tessera/build}
LOG=$CACHE_DIR/build.log
COMPONENTS=(kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy)

log() { printf '[kube-build] %s\n' "$*" >&2; }
die() { printf '[kube-build] ERROR: %s\n' "$*" >&2; exit 1; }

SUDO=
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "not root and no sudo: cannot install Debian packages"
    SUDO=sudo
fi

apt_updated=0
apt_update_once() {
    if [[ $apt_updated -eq 0 ]]; then
        log "apt-get update"
        $SUDO apt-get update -qq
        apt_updated=1
    fi
}

# ensure_pkgs PKG... : install the Debian packages that are not installed yet.
ensure_pkgs() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    apt_update_once
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

# binary_ok NAME : the cached binary exists and reports $KUBE_VERSION.
binary_ok() {
    local b=$BIN_DIR/$1
    [[ -x $b ]] && "$b" --version 2>/dev/null | grep -qF "$KUBE_VERSION"
}

# all_ok : both binaries are there, report $KUBE_VERSION, and were built by this RECIPE
# (an older recipe's binaries are rebuilt, not trusted).
all_ok() {
    local c
    [[ $(cat "$CACHE_DIR/recipe" 2>/dev/null) == "$RECIPE" ]] || return 1
    for c in "${COMPONENTS[@]}"; do binary_ok "$c" || return 1; done
}

ensure_etcd() {
    ensure_pkgs etcd-server
    command -v etcd >/dev/null || die "etcd not on PATH after installing etcd-server"
}

# Real nodes (scripts/node.sh, scripts/image-build.sh): Debian's containerd, runc, CNI plugins, iptables (kube-proxy), buildah and mmdebstrap (images without a
# registry) and busybox-static (the pause and test images). Not fatal: without them the control plane
# still builds, and scripts/node.sh says what is missing.
ensure_node_pkgs() {
    ensure_pkgs containerd runc containernetworking-plugins iptables buildah busybox-static mmdebstrap \
        || log "WARNING: could not install the real nodes' packages; scripts/node.sh will say what is missing"
}

# Debian's kubectl 1.20.2 (package kubernetes-client), unpacked into the cache
# without installing it (on this machine /usr/bin/kubectl belongs to another package).
ensure_kubectl() {
    [[ ${SKIP_KUBECTL:-0} == 1 ]] && return 0
    if [[ -x $BIN_DIR/kubectl ]] && "$BIN_DIR/kubectl" version --client --short 2>/dev/null \
            | grep -qF "$KUBE_VERSION"; then
        return 0
    fi
    local tmp
    tmp=$(mktemp -d "$BUILD_ROOT/kubectl.XXXXXX")
    apt_update_once
    log "fetching Debian's kubectl (kubernetes-client) into $BIN_DIR"
    if (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root kubernetes-client \
            && dpkg-deb -x kubernetes-client_*.deb root \
            && install -m 0755 root/usr/bin/kubectl "$BIN_DIR/kubectl") >/dev/null 2>&1; then
        :
    else
        log "WARNING: could not fetch Debian kubectl (kubernetes-client); continuing without it"
    fi
    rm -rf "$tmp"
}

report() {
    echo "[kube-build] binaries:"
    local c
    for c in "${COMPONENTS[@]}"; do
        printf '  %-15s %s  (%s)\n' "$c" "$BIN_DIR/$c" "$("$BIN_DIR/$c" --version 2>&1 | head -1)"
    done
    printf '  %-15s %s  (%s)\n' etcd "$(command -v etcd)" "$(etcd --version 2>&1 | head -1)"
    if [[ -x $BIN_DIR/kubectl ]]; then
        printf '  %-15s %s  (%s)\n' kubectl "$BIN_DIR/kubectl" \
            "$("$BIN_DIR/kubectl" version --client --short 2>&1 | head -1)"
    fi
}

mkdir -p "$BIN_DIR" "$BUILD_ROOT"

ensure_etcd
ensure_node_pkgs
if all_ok; then
    log "cached $KUBE_VERSION binaries found in $BIN_DIR; nothing to build"
    ensure_kubectl
    report
    exit 0
fi

# --- build -------------------------------------------------------------------
ensure_pkgs dpkg-dev golang-go rsync make openssl ca-certificates
command -v go >/dev/null || die "go not on PATH after installing golang-go"

BUILD_DIR=$(mktemp -d "$BUILD_ROOT/kube.XXXXXX")
cleanup() {
    if [[ ${KEEP_BUILD:-0} == 1 ]]; then
        log "KEEP_BUILD=1: keeping $BUILD_DIR"
    else
        rm -rf "$BUILD_DIR"
    fi
}
trap cleanup EXIT

: >"$LOG"
fail() {
    log "ERROR: $*"
    log "---- last 40 lines of $LOG ----"
    tail -n 40 "$LOG" >&2 || true
    exit 1
}

# A private deb-src twin of the system's Debian entries, so the system apt lists
# are left as they are.
APT_DIR=$BUILD_DIR/apt
mkdir -p "$APT_DIR/parts" "$APT_DIR/lists/partial"
: >"$APT_DIR/empty.list"
src_count=0
shopt -s nullglob
for f in /etc/apt/sources.list.d/*.sources; do
    if grep -q 'debian' "$f" && grep -q '^Types:.*\bdeb\b' "$f"; then
        sed -E 's/^Types:.*/Types: deb-src/' "$f" >"$APT_DIR/parts/$(basename "$f")"
        src_count=$((src_count + 1))
    fi
done
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    if grep -Eq '^deb[[:space:]].*debian' "$f"; then
        grep -E '^deb[[:space:]].*debian' "$f" | sed 's/^deb /deb-src /' \
            >"$APT_DIR/parts/$(basename "$f" .list)-src.list"
        src_count=$((src_count + 1))
    fi
done
shopt -u nullglob
[[ $src_count -gt 0 ]] || die "no Debian apt source entries found to derive deb-src from"
APT_OPTS=(
    -o "Dir::Etc::SourceList=$APT_DIR/empty.list"
    -o "Dir::Etc::SourceParts=$APT_DIR/parts"
    -o "Dir::State::Lists=$APT_DIR/lists"
    -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
    -o "APT::Sandbox::User=root"
)
log "fetching the kubernetes source package (deb-src lists in $APT_DIR)"
apt-get -q "${APT_OPTS[@]}" update >>"$LOG" 2>&1 || fail "apt-get update (deb-src) failed"
SRC_VERSION=$(apt-cache "${APT_OPTS[@]}" showsrc kubernetes 2>/dev/null \
    | awk '/^Version:/ {print $2}' | grep -F 'really1.20.2' | sort -V | tail -1 || true)
[[ -n $SRC_VERSION ]] || fail "Debian has no kubernetes source with 1.20.2 (showsrc kubernetes)"
log "kubernetes source version $SRC_VERSION"
(cd "$BUILD_DIR" && apt-get -q "${APT_OPTS[@]}" source "kubernetes=$SRC_VERSION") >>"$LOG" 2>&1 \
    || fail "apt-get source kubernetes=$SRC_VERSION failed"
SRC_TREE=$(find "$BUILD_DIR" -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
[[ -n $SRC_TREE && -f $SRC_TREE/Makefile ]] || fail "unpacked source tree not found in $BUILD_DIR"
rm -f "$BUILD_DIR"/kubernetes_*.tar.* "$BUILD_DIR"/kubernetes_*.dsc

# Kubernetes 1.20 vendors github.com/modern-go/reflect2 v1.0.1, which declares the
# runtime's reflect.mapiterinit with its pre-Go-1.18 signature (returning the iterator).
# Go 1.18 changed it to fill an iterator passed in, so with bookworm's Go 1.19 the
# v1.0.1 map iterator reads a garbage pointer: json-iterator segfaults
# (reflect2/unsafe_map.go:112) as soon as the apiserver encodes an unstructured object,
# i.e. on every custom-resource request. v1.0.2 has the Go 1.18 signature (go_above_118.go)
# and the same API. Debian ships its source as golang-github-modern-go-reflect2-dev;
# it is unpacked (not installed) over vendor/. `make` builds in GOPATH mode
# (hack/lib/init.sh sets GO111MODULE=off), which reads vendor/ only; go.mod and
# vendor/modules.txt are still made to record v1.0.2, so the tree's module metadata
# says what is vendored (module mode, which checks the two agree, does not work on this
# tree with Go 1.19 anyway: "updates to go.mod needed", with or without this change).
replace_reflect2() {
    local tmp=$BUILD_DIR/reflect2 deb ver src vend=$SRC_TREE/vendor/github.com/modern-go/reflect2
    mkdir -p "$tmp"
    apt_update_once
    (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root golang-github-modern-go-reflect2-dev) \
        >>"$LOG" 2>&1 || fail "apt-get download golang-github-modern-go-reflect2-dev failed"
    deb=$(find "$tmp" -maxdepth 1 -name '*.deb' | head -1)
    ver=$(dpkg-deb -f "$deb" Version)            # e.g. 1.0.2-2
    ver=${ver#*:}; ver=v${ver%%-*}               # -> v1.0.2
    dpkg --compare-versions "${ver#v}" ge 1.0.2 \
        || fail "Debian's reflect2 is $ver; need >= v1.0.2 for Go >= 1.18"
    dpkg-deb -x "$deb" "$tmp/root"
    src=$tmp/root/usr/share/gocode/src/github.com/modern-go/reflect2
    [[ -f $src/go_above_118.go && -d $vend ]] || fail "reflect2 source or vendor dir not found"
    grep -q '^# github.com/modern-go/reflect2 v1.0.1' "$SRC_TREE/vendor/modules.txt" \
        || fail "vendor/modules.txt does not list reflect2 v1.0.1; the source tree changed"
    # Keep the vendored LICENSE; replace every source file with Debian's, leaving out tests
    # and go.mod as `go mod vendor` does.
    find "$vend" -maxdepth 1 -type f ! -name LICENSE -delete
    find "$src" -maxdepth 1 -type f ! -name '*_test.go' ! -name go.mod -exec cp {} "$vend/" \;
    sed -i "s#github.com/modern-go/reflect2 v1.0.1#github.com/modern-go/reflect2 $ver#g" \
        "$SRC_TREE/go.mod" "$SRC_TREE/vendor/modules.txt"
    log "vendored reflect2 replaced by Debian's $ver (golang-github-modern-go-reflect2-dev)"
}
replace_reflect2

# Build the way debian/rules does: GOPATH mode with the tree linked into GOPATH.
# The version (v1.20.2) comes from the git-archive stamp in hack/lib/version.sh.
log "building ${COMPONENTS[*]} with $(go version | awk '{print $3}')" \
    "(10-20 minutes on 2 cores); log: $LOG"
start=$(date +%s)
(
    cd "$SRC_TREE"
    export GOPATH=$SRC_TREE/.go CGO_ENABLED=0 GOCACHE=$BUILD_DIR/gocache GOFLAGS=
    mkdir -p .go/src/k8s.io
    [[ -L .go/src/k8s.io/kubernetes ]] || ln -s ../../.. .go/src/k8s.io/kubernetes
    rm -rf _output
    make WHAT="${COMPONENTS[*]/#/cmd/}"
) >>"$LOG" 2>&1 || fail "make failed after $(( ($(date +%s) - start) / 60 )) min"
log "build took $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s"

for c in "${COMPONENTS[@]}"; do
    [[ -x $SRC_TREE/_output/bin/$c ]] || fail "$c missing from _output/bin after make"
    install -m 0755 "$SRC_TREE/_output/bin/$c" "$BIN_DIR/$c.new"
    mv -f "$BIN_DIR/$c.new" "$BIN_DIR/$c"
done
echo "$RECIPE" >"$CACHE_DIR/recipe"
all_ok || fail "built binaries do not report $KUBE_VERSION: $("$BIN_DIR/kube-apiserver" --version 2>&1)"
echo "$SRC_VERSION" >"$CACHE_DIR/source-version"

ensure_kubectl
report
