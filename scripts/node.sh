#!/usr/bin/env bash
# Start/stop a real Kubernetes node (kubelet v1.20.2 from the same source build as the control plane,
# with a containerd of its own) joined to a local control plane made by scripts/controlplane.sh.
#
#   node.sh start CP_DIR NAME INDEX   # INDEX 1..200: the node's pod bridge tbrINDEX and subnet 10.244.INDEX.0/24,
#                                     # whose gateway 10.244.INDEX.1 is the node's address
#   node.sh stop  CP_DIR NAME
#   node.sh remove CP_DIR NAME        # stop, then delete its containerd root (images, containers): a test's teardown
#   node.sh images                    # build (once, cached) the local images every node imports
#   node.sh import CP_DIR NAME ARCHIVE  # load an OCI archive (scripts/image-build.sh's) into the node's containerd
#   node.sh restart CP_DIR NAME kubelet|containerd  # one component restarts; the node's containers keep running
#   node.sh kill CP_DIR NAME CONTAINER_ID           # SIGKILL one container's process (a crash; its kubelet restarts it)
#
# One containerd per node (its own root, state, socket and CNI config), so a node's images and
# containers are its own and a node can be stopped with everything it ran, as a machine would be.
# The pod network is the CNI bridge plugin, one bridge and /24 per node on this host: pods of every
# node reach each other through the host's routes. No kube-proxy yet, so no Service addresses.
# There is no registry: the images are built locally with buildah from Debian packages and imported
# into each node's containerd; pods name them with imagePullPolicy: Never (or IfNotPresent).
#   docker.io/tessera/pause:local    the pod sandbox (busybox-static's sleep)
#   docker.io/tessera/busybox:local  a shell and the usual tools (busybox-static), for test pods
#   registry.k8s.io/kube-scheduler:v1.20.2  kube-scheduler of the same build (the second-scheduler install's)
#
# What is not the production shape, and why: the kubelet uses the control plane's admin
# kubeconfig (the local apiserver has no Node authorizer or bootstrap tokens); its API listens on
# 127.0.0.1 with client certificates from the local CA only (no webhook authn); cgroupsPerQOS is off,
# because several kubelets on one host would otherwise all claim /kubepods.
#
# Layout of CP_DIR/nodes/NAME: containerd/ (root, state, config.toml), kubelet/ (root dir),
# device-plugins/ (the kubelet's /var/lib/kubelet/device-plugins inside the node's mount namespace),
# cni/ (conflist), logs/ (containerd.log, kubelet.log), pids, ports.env. The sockets live under
# /run/tessera-nodes/<hash> (a unix socket path must stay under 108 bytes).
#
# Needs root, cgroups and Debian's containerd, runc, containernetworking-plugins, buildah and
# busybox-static (scripts/kube-build.sh installs them); stops with a clear message otherwise.
# Environment: TESSERA_KUBE_BIN (default ~/.cache/tessera/kube-v1.20.2-r4/bin), NODE_TIMEOUT
# (seconds to wait for Ready, default 120), TESSERA_IMAGE_CACHE (default ~/.cache/tessera/images).
set -euo pipefail

KUBE_BIN=${TESSERA_KUBE_BIN:-$HOME/.cache/tessera/kube-v1.20.2-r4/bin}
IMAGE_CACHE=${TESSERA_IMAGE_CACHE:-$HOME/.cache/tessera/images}
NODE_TIMEOUT=${NODE_TIMEOUT:-120}
PAUSE_IMAGE=docker.io/tessera/pause:local
BUSYBOX_IMAGE=docker.io/tessera/busybox:local

LOG_PREFIX=node
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
usage() { usage_from "${BASH_SOURCE[0]}" 2,13; }

need_prereqs() {
    [[ $(id -u) -eq 0 ]] || die "a kubelet and containerd need root (they make mounts, cgroups and network namespaces)"
    [[ -d /sys/fs/cgroup ]] && [[ -n $(ls /sys/fs/cgroup 2>/dev/null) ]] || die "no cgroup file system under /sys/fs/cgroup"
    local b
    for b in containerd containerd-shim-runc-v2 runc ctr buildah; do
        command -v "$b" >/dev/null || die "$b not found: run scripts/kube-build.sh (it installs Debian's containerd, runc, containernetworking-plugins, buildah, busybox-static)"
    done
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
        || die "CNI plugins missing in /usr/lib/cni: apt-get install containernetworking-plugins"
    [[ -x /bin/busybox ]] || die "/bin/busybox missing: apt-get install busybox-static"
}

# --- images ----------------------------------------------------------------------------------------

# The images depend only on busybox-static's version: rebuilt when it changes.
IMAGES_RECIPE=2  # bump when build_image changes
images_stamp() { echo "$IMAGES_RECIPE $(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo unknown)"; }

# build_image NAME ENTRYPOINT-JSON : a scratch image holding busybox and its applet links.
build_image() {
    local name=$1 entry=$2 out=$3 store ctr mnt a
    store=$(mktemp -d "$IMAGE_CACHE/build.XXXXXX")
    local B=(buildah --storage-driver vfs --root "$store/root" --runroot "$store/run")
    ctr=$("${B[@]}" from scratch)
    mnt=$("${B[@]}" mount "$ctr")
    mkdir -p "$mnt/bin" "$mnt/tmp" "$mnt/etc"
    install -m 0755 /bin/busybox "$mnt/bin/busybox"
    for a in $(/bin/busybox --list); do [[ $a == busybox ]] || ln -s busybox "$mnt/bin/$a"; done
    echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >"$mnt/etc/passwd"
    "${B[@]}" umount "$ctr" >/dev/null
    "${B[@]}" config --entrypoint "$entry" --cmd '' --env PATH=/bin "$ctr"
    "${B[@]}" commit -q "$ctr" "$name" >/dev/null
    "${B[@]}" push -q "$name" "oci-archive:$out.tmp:$name"
    mv -f "$out.tmp" "$out"
    rm -rf "$store"
}

# kube-scheduler's image, under the name the shipped second-scheduler Deployment gives it (manifests/k8s-1.20/
# second-scheduler sets the tag v1.20.2), from the same source build as the control plane: the static binary at
# the path the upstream image has it, nothing else. Rebuilt when the binary changes.
SCHEDULER_IMAGE=registry.k8s.io/kube-scheduler:v1.20.2
scheduler_image() {
    local bin=$KUBE_BIN/kube-scheduler stamp store ctr mnt
    [[ -x $bin ]] || die "$bin missing: scripts/kube-build.sh builds it"
    stamp=$(sha256sum "$bin" | cut -c1-16)
    [[ -f $IMAGE_CACHE/kube-scheduler.tar && $(cat "$IMAGE_CACHE/kube-scheduler.stamp" 2>/dev/null) == "$stamp" ]] && return 0
    log "building $SCHEDULER_IMAGE with buildah from $bin"
    store=$(mktemp -d "$IMAGE_CACHE/build.XXXXXX")
    local B=(buildah --storage-driver vfs --root "$store/root" --runroot "$store/run")
    ctr=$("${B[@]}" from scratch)
    mnt=$("${B[@]}" mount "$ctr")
    install -D -m 0755 "$bin" "$mnt/usr/local/bin/kube-scheduler"
    mkdir -p "$mnt/tmp"
    "${B[@]}" umount "$ctr" >/dev/null
    "${B[@]}" config --entrypoint '["/usr/local/bin/kube-scheduler"]' --cmd '' "$ctr"
    "${B[@]}" commit -q "$ctr" "$SCHEDULER_IMAGE" >/dev/null
    "${B[@]}" push -q "$SCHEDULER_IMAGE" "oci-archive:$IMAGE_CACHE/kube-scheduler.tar.tmp:$SCHEDULER_IMAGE"
    mv -f "$IMAGE_CACHE/kube-scheduler.tar.tmp" "$IMAGE_CACHE/kube-scheduler.tar"
    echo "$stamp" >"$IMAGE_CACHE/kube-scheduler.stamp"
    rm -rf "$store"
}

cmd_images() {
    need_prereqs
    mkdir -p "$IMAGE_CACHE"
    scheduler_image
    local stamp
    stamp=$(images_stamp)
    if [[ -f $IMAGE_CACHE/pause.tar && -f $IMAGE_CACHE/busybox.tar && $(cat "$IMAGE_CACHE/stamp" 2>/dev/null) == "$stamp" ]]; then
        return 0
    fi
    log "building $PAUSE_IMAGE and $BUSYBOX_IMAGE with buildah (busybox-static $stamp)"
    build_image "$PAUSE_IMAGE" '["/bin/busybox", "sleep", "2147483647"]' "$IMAGE_CACHE/pause.tar"
    build_image "$BUSYBOX_IMAGE" '["/bin/sh"]' "$IMAGE_CACHE/busybox.tar"
    echo "$stamp" >"$IMAGE_CACHE/stamp"
    log "images in $IMAGE_CACHE: $(du -sh "$IMAGE_CACHE"/pause.tar "$IMAGE_CACHE"/busybox.tar | awk '{printf "%s %s  ", $2, $1}')"
}

# --- one node --------------------------------------------------------------------------------------

node_paths() {
    CP=$(cd "$1" && pwd)
    NAME=$2
    [[ $NAME =~ ^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$ ]] || die "node name '$NAME' is not a DNS label of at most 42 characters"
    N=$CP/nodes/$NAME
    RUN=/run/tessera-nodes/$(printf '%s' "$N" | sha256sum | cut -c1-12)
    SOCK=$RUN/containerd.sock
}

pid_alive() { [[ -n ${1:-} && -d /proc/$1 ]]; }

launch() {
    local name=$1
    shift
    setsid "$@" >>"$N/logs/$name.log" 2>&1 </dev/null &
    echo "$name $!" >>"$N/pids"
}

# The node's own mount namespace, held by a sleeping process: the kubelet 1.20 keeps some directories at
# fixed paths, not under --root-dir, so two kubelets on one host would share them. Inside the namespace each is
# the node's own directory (a bind mount); host mounts still propagate in (slave), the node's do not leak out.
# The kubelet and containerd run in it (they must share it: containerd mounts what the kubelet prepared).
#   /var/lib/kubelet/device-plugins  one registration socket and one checkpoint per host otherwise;
#   /var/lib/kubelet/pod-resources   the PodResources socket (the kubelet makes it under --root-dir): bound at
#                                    the default path so the device plugin DaemonSet's hostPath finds it;
#   /var/log/pods, /var/log/containers  container logs and their links: each kubelet's garbage collector
#                                    deletes the log directories of pods it does not run, i.e. the other node's.
NODE_DIRS=(device-plugins:/var/lib/kubelet/device-plugins kubelet/pod-resources:/var/lib/kubelet/pod-resources
           pod-logs:/var/log/pods container-logs:/var/log/containers)
start_mount_namespace() {
    local bind binds="" own target pid i
    for bind in "${NODE_DIRS[@]}"; do
        own=$N/${bind%%:*} target=${bind#*:}
        mkdir -p "$own" "$target"
        binds+="mount --bind '$own' '$target' && "
    done
    launch mountns unshare --mount --propagation slave /bin/sh -c "${binds}exec sleep infinity"
    pid=$(pid_of mountns)
    for i in $(seq 1 50); do
        grep -q " $target " "/proc/$pid/mounts" 2>/dev/null && return 0  # the last bind made: all were
        sleep 0.1
    done
    die "could not make $NAME's mount namespace (unshare --mount needs CAP_SYS_ADMIN); see $N/logs/mountns.log"
}

write_containerd_config() {
    cat >"$N/containerd/config.toml" <<EOF
version = 2
root = "$N/containerd/root"
state = "$RUN/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$N/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # without it every sandbox fails: runc may not lower /proc/self/oom_score_adj here
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$N/cni"
EOF
}

write_cni_config() {
    local index=$1
    cat >"$N/cni/10-tessera.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "tessera-$NAME", "plugins": [
  {"type": "bridge", "bridge": "tbr$index", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.$index.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$N/cni-ipam"}},
  {"type": "loopback"}]}
EOF
}

write_kubelet_config() {
    local port=$1 hport=$2
    cat >"$N/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $hport
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $CP/pki/ca.crt}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 10s
serializeImagePulls: false
resolvConf: /etc/resolv.conf
EOF
}

start_containerd() {
    launch containerd nsenter --mount="/proc/$(pid_of mountns)/ns/mnt" -- containerd --config "$N/containerd/config.toml"
    local i
    for i in $(seq 1 100); do
        ctr --address "$SOCK" version >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    tail -20 "$N/logs/containerd.log" >&2
    die "containerd of $NAME did not answer on $SOCK"
}

start_kubelet() {
    launch kubelet nsenter --mount="/proc/$(pid_of mountns)/ns/mnt" -- "$KUBE_BIN/kubelet" \
        --kubeconfig="$CP/kubeconfig" --config="$N/kubelet-config.yaml" \
        --container-runtime=remote --container-runtime-endpoint="unix://$SOCK" \
        --runtime-request-timeout=2m \
        --pod-infra-container-image="$PAUSE_IMAGE" \
        --root-dir="$N/kubelet" --cert-dir="$N/pki" \
        --hostname-override="$NAME" --node-ip="$NODE_IP" \
        --node-labels="tessera.dev/kubelet=real" \
        --v=2
}

pid_of() { awk -v n="$1" '$1 == n {p = $2} END {print p}' "$N/pids" 2>/dev/null; }

# end_process NAME : TERM, then KILL after 5 s; its line leaves the pids file.
end_process() {
    local pid t
    pid=$(pid_of "$1")
    if pid_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for t in $(seq 1 50); do pid_alive "$pid" || break; sleep 0.1; done
        pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
    fi
    awk -v n="$1" '$1 != n' "$N/pids" >"$N/pids.new" 2>/dev/null || true
    mv -f "$N/pids.new" "$N/pids"
}

# A component restarting on a running node, as a kubelet or containerd upgrade (or crash and systemd
# restart) does: the containers keep running (containerd's shims hold them), the kubelet finds them again.
cmd_restart() {
    [[ $# -eq 3 ]] || usage
    node_paths "$1" "$2"
    [[ -f $N/pids && -f $N/ports.env ]] || die "node $NAME is not running from $N"
    # shellcheck disable=SC1091
    source "$N/ports.env"
    case $3 in
        kubelet) end_process kubelet; start_kubelet ;;
        containerd) end_process containerd; start_containerd ;;
        *) die "restart takes kubelet or containerd, got '$3'" ;;
    esac
    log "node $NAME: $3 restarted (pid $(pid_of "$3"))"
}

cmd_start() {
    [[ $# -eq 3 ]] || usage
    [[ -d $1 ]] || die "control plane directory $1 does not exist: start one first (scripts/controlplane.sh start $1)"
    node_paths "$1" "$2"
    local index=$3
    [[ $index =~ ^[0-9]+$ ]] && (( index >= 1 && index <= 200 )) || die "INDEX must be 1..200, got '$index'"
    NODE_IP=10.244.$index.1
    [[ -f $CP/kubeconfig ]] || die "$CP/kubeconfig missing: start the control plane first (scripts/controlplane.sh start $CP)"
    need_prereqs
    [[ -x $KUBE_BIN/kubelet ]] || die "$KUBE_BIN/kubelet missing: run scripts/kube-build.sh (recipe r4 builds it)"
    if [[ -f $N/pids ]]; then
        local name pid
        while read -r name pid; do
            pid_alive "$pid" && die "node $NAME already runs from $N ($name pid $pid); run: $0 stop $CP $NAME"
        done <"$N/pids"
    fi
    cmd_images
    rm -f "$N/pids"
    mkdir -p "$N/containerd" "$N/kubelet" "$N/cni" "$N/logs" "$N/pki" "$RUN"
    write_containerd_config
    write_cni_config "$index"
    local port hport
    read -r port hport <<<"$(free_ports 2)"
    write_kubelet_config "$port" "$hport"
    echo "KUBELET_PORT=$port KUBELET_HEALTHZ_PORT=$hport CONTAINERD_SOCK=$SOCK NODE_IP=$NODE_IP" >"$N/ports.env"

    # the node's own address, as a machine has one: the kubelet refuses a loopback --node-ip, and the
    # apiserver reaches the kubelet (logs, exec) at the node's InternalIP. It is the gateway of the node's
    # pod bridge, made here (the CNI bridge plugin takes a bridge that exists); no dummy interfaces here
    ip link show "tbr$index" >/dev/null 2>&1 || ip link add "tbr$index" type bridge \
        || die "cannot add the bridge tbr$index (needs CAP_NET_ADMIN)"
    ip addr replace "$NODE_IP/24" dev "tbr$index"
    ip link set "tbr$index" up
    local t0
    t0=$(date +%s.%N)
    start_mount_namespace
    start_containerd
    local img
    for img in pause busybox kube-scheduler; do
        ctr --address "$SOCK" -n k8s.io images import --all-platforms "$IMAGE_CACHE/$img.tar" >/dev/null \
            || die "importing $img into $NAME's containerd failed"
    done
    start_kubelet
    local kubectl=$KUBE_BIN/kubectl
    [[ -x $kubectl ]] || kubectl=$(command -v kubectl) || die "kubectl not found"
    local start
    start=$(date +%s)
    until "$kubectl" --kubeconfig "$CP/kubeconfig" get node "$NAME" \
            -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True; do
        pid_alive "$(awk '$1 == "kubelet" {print $2}' "$N/pids")" \
            || { tail -30 "$N/logs/kubelet.log" >&2; cmd_stop "$CP" "$NAME"; die "the kubelet of $NAME exited; see $N/logs/kubelet.log"; }
        if (( $(date +%s) - start >= NODE_TIMEOUT )); then
            tail -30 "$N/logs/kubelet.log" >&2
            cmd_stop "$CP" "$NAME"
            die "node $NAME not Ready after ${NODE_TIMEOUT}s; see $N/logs/kubelet.log"
        fi
        sleep 0.5
    done
    log "node $NAME Ready after $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$t0" "$(date +%s.%N)") s (kubelet $NODE_IP:$port, containerd $SOCK, pods 10.244.$index.0/24)"
}

# Stop the kubelet, then every container of the node's containerd, then containerd: a machine going down.
cmd_stop() {
    [[ $# -eq 2 ]] || usage
    node_paths "$1" "$2"
    [[ -f $N/pids ]] || { log "node $NAME: nothing to stop"; return 0; }
    local kpid cpid t
    kpid=$(awk '$1 == "kubelet" {print $2}' "$N/pids")
    cpid=$(awk '$1 == "containerd" {print $2}' "$N/pids")
    if pid_alive "$kpid"; then kill -TERM "$kpid" 2>/dev/null || true; fi
    for t in $(seq 1 50); do pid_alive "$kpid" || break; sleep 0.1; done
    pid_alive "$kpid" && kill -KILL "$kpid" 2>/dev/null || true
    if pid_alive "$cpid"; then
        local c
        for c in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "$SOCK" -n k8s.io tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true
        done
        sleep 0.5
        for c in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
            ctr --address "$SOCK" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true
        done
        kill -TERM "$cpid" 2>/dev/null || true
        for t in $(seq 1 50); do pid_alive "$cpid" || break; sleep 0.1; done
        pid_alive "$cpid" && kill -KILL "$cpid" 2>/dev/null || true
    fi
    # shims outlive containerd by design: end the ones of this node's state dir
    pkill -KILL -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null || true
    # the last process of the node's mount namespace: its mounts go with it
    end_process mountns
    # mounts the kubelet and containerd made under the node's dirs (pod volumes, rootfs, sandboxes' netns)
    # (none left is usual once the namespace's last process is gone: grep's status 1 must not end the stop here)
    { grep -oE " ($N|$RUN)/[^ ]*" /proc/self/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    local index
    index=$(sed -nE 's/.*"bridge": "tbr([0-9]+)".*/\1/p' "$N/cni/10-tessera.conflist" 2>/dev/null)
    if [[ -n $index ]]; then
        ip link del "tbr$index" 2>/dev/null || true
    fi
    rm -f "$N/pids"
    log "node $NAME stopped"
}

# A stopped node's containerd root holds every image it imported, unpacked: 2.4 GB a node once the ray image is in
# (measured here). Each end-to-end module starts nodes of its own, and each module's were kept to the run's end, so
# the later modules ran on what disk the earlier ones left. The node's logs stay.
cmd_remove() {
    [[ $# -eq 2 ]] || usage
    cmd_stop "$1" "$2"
    node_paths "$1" "$2"
    rm -rf "$N/containerd" "$RUN"
    log "node $NAME removed: its containerd root deleted"
}

cmd_import() {
    [[ $# -eq 3 ]] || usage
    node_paths "$1" "$2"
    [[ -f $3 ]] || die "image archive $3 not found (scripts/image-build.sh makes one)"
    [[ -S $SOCK ]] || die "node $NAME is not running (no containerd socket $SOCK)"
    ctr --address "$SOCK" -n k8s.io images import --all-platforms "$3" >/dev/null || die "importing $3 into $NAME failed"
}

cmd_kill() {
    [[ $# -eq 3 ]] || usage
    node_paths "$1" "$2"
    local id=${3#containerd://}   # as a pod's status names it
    [[ $id =~ ^[0-9a-f]{64}$ ]] || die "'$3' is not a container id (64 hex digits, as in status.containerStatuses[].containerID)"
    [[ -S $SOCK ]] || die "node $NAME is not running (no containerd socket $SOCK)"
    ctr --address "$SOCK" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null || die "no running container $id on $NAME"
}

[[ $# -ge 1 ]] || usage
cmd=$1
shift
case $cmd in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    remove) cmd_remove "$@" ;;
    images) cmd_images ;;
    import) cmd_import "$@" ;;
    restart) cmd_restart "$@" ;;
    kill) cmd_kill "$@" ;;
    *) usage ;;
esac
