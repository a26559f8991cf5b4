#!/usr/bin/env bash
# Start/stop a local Kubernetes 1.20 control plane (etcd, kube-apiserver and,
# optionally, kube-scheduler and kube-controller-manager) on loopback only, for
# end-to-end tests.
#
#   controlplane.sh start  DIR [SCHEDULER_CONFIG]
#   controlplane.sh stop   DIR
#   controlplane.sh env    DIR        # prints `export KUBECONFIG=DIR/kubeconfig` (+ endpoints)
#   controlplane.sh status DIR
#
# Binaries: kube-apiserver/kube-scheduler/kube-controller-manager from $TESSERA_KUBE_BIN
# (default ~/.cache/tessera/kube-v1.20.2-r4/bin, built by scripts/kube-build.sh),
# etcd from $ETCD_BIN or PATH (Debian etcd-server).
#
# Layout of DIR: etcd/ (data), pki/ (CA, serving cert, SA key, token), logs/,
# kubeconfig (admin, token auth), scheduler-config.yaml (the rendered copy),
# pids ("name pid" lines), endpoints.env.
#
# SCHEDULER_CONFIG is a KubeSchedulerConfiguration (v1beta1 for 1.20). A copy is
# rendered into DIR: the text __KUBECONFIG__ is replaced by DIR/kubeconfig, and
# (when PyYAML is importable) clientConnection.kubeconfig is forced to
# DIR/kubeconfig, leaderElection.leaderElect to false and healthz/metrics bind
# addresses to a free 127.0.0.1 port. Without PyYAML the config must already
# hold those settings (with __KUBECONFIG__ as the kubeconfig path).
#
# CP_CONTROLLERS (opt-in): when set, kube-controller-manager runs too, with this
# value as its --controllers (e.g. job,garbagecollector; `*` is every on-by-default
# controller; `-name` turns one off). Off by default because the e2e clusters' Nodes
# are fake (no kubelet): 40 s after a Node's last status the nodelifecycle controller
# marks it Ready=Unknown and taints it node.kubernetes.io/unreachable (nothing new
# schedules there; its pods are evicted unless every Node is down); the daemonset
# controller would put pods on them; the garbagecollector deletes every pod whose
# owner object is absent. Its secure port (healthz) is a free 127.0.0.1 port; it
# uses the admin kubeconfig, no leader election, and the SA key and CA in DIR/pki
# (token controller, CSR signer). Log: DIR/logs/kube-controller-manager.log.
#
# CP_POD_NETWORK=1 (opt-in, with scripts/node.sh's real nodes): pods reach the control plane as
# they do on a cluster. The apiserver listens on 10.244.0.1 (an address put on lo, which every
# node's pod bridge routes to through the host) instead of 127.0.0.1, keeps the `kubernetes`
# Service's endpoints itself (lease reconciler), and admits pods with the ServiceAccount plugin (the
# token Secret mounted); kube-proxy from the same build runs on the host (iptables mode, one for
# every node on this host, since they share its network namespace) so pods and the host reach
# Services by ClusterIP; CP_CONTROLLERS defaults to the controllers real workloads need
# (Deployments, DaemonSets, Services' endpoints, ServiceAccounts and their tokens, the garbage
# collector). Off by default: the e2e clusters of fake Nodes have no pod to serve, and pods made by
# those tests name ServiceAccounts nobody creates. kube-proxy's rules are removed at stop
# (`kube-proxy --cleanup`); the lo address stays (idempotent, routes nothing else).
#
# Environment: CP_TIMEOUT (seconds per component wait, default 120),
# CP_VERBOSITY (klog -v, default 2), TESSERA_PYTHON (python with PyYAML),
# CP_CONTROLLERS, CP_POD_NETWORK (above).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KUBE_BIN=${TESSERA_KUBE_BIN:-$HOME/.cache/tessera/kube-v1.20.2-r4/bin}
CP_TIMEOUT=${CP_TIMEOUT:-120}
CP_VERBOSITY=${CP_VERBOSITY:-2}
SERVICE_CIDR=10.0.0.0/24
POD_CIDR=10.244.0.0/16            # scripts/node.sh gives node INDEX the /24 10.244.INDEX.0
POD_SIDE_ADDRESS=10.244.0.1       # CP_POD_NETWORK=1: where pods reach the apiserver
POD_NETWORK_CONTROLLERS=deployment,replicaset,daemonset,endpoint,endpointslice,serviceaccount,serviceaccount-token,garbagecollector

LOG_PREFIX=controlplane
# shellcheck source=scripts/common.sh
source "$SCRIPT_DIR/common.sh"
usage() { usage_from "${BASH_SOURCE[0]}" 2,9; }

abspath() {
    case $1 in
        /*) printf '%s\n' "${1%/}" ;;
        *)  printf '%s/%s\n' "$(pwd)" "${1%/}" ;;
    esac
}

# pid_alive PID NAME : PID is running and is the binary NAME (guards against reuse).
pid_alive() {
    local pid=$1 name=$2
    [[ -n $pid && -d /proc/$pid ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | awk '{print $1}' | grep -q "$name\$"
}

show_log_tail() {
    local name=$1 f=$DIR/logs/$1.log
    log "---- last 30 lines of $f ----"
    tail -n 30 "$f" >&2 2>/dev/null || true
    log "---- end of $name log ----"
}

# launch NAME BINARY ARGS... : start in its own session, log to DIR/logs/NAME.log.
launch() {
    local name=$1 bin=$2
    shift 2
    # setsid without -f: the background child is no group leader, so setsid
    # execs in place and $! is the component's own pid.
    setsid "$bin" "$@" >"$DIR/logs/$name.log" 2>&1 </dev/null &
    local pid=$!
    echo "$name $pid" >>"$DIR/pids"
    log "started $name (pid $pid), log $DIR/logs/$name.log"
}

pid_of() { awk -v n="$1" '$1 == n {p = $2} END {print p}' "$DIR/pids" 2>/dev/null; }

# wait_for NAME BINARYNAME CHECK-COMMAND... : poll until the check passes.
wait_for() {
    local name=$1 binname=$2
    shift 2
    local pid start now
    pid=$(pid_of "$name")
    start=$(date +%s)
    while true; do
        if "$@" >/dev/null 2>&1; then
            log "$name ready after $(( $(date +%s) - start )) s"
            return 0
        fi
        if ! pid_alive "$pid" "$binname"; then
            show_log_tail "$name"
            stop_all quiet
            die "$name (pid $pid) exited during start-up; see $DIR/logs/$name.log"
        fi
        now=$(date +%s)
        if (( now - start >= CP_TIMEOUT )); then
            show_log_tail "$name"
            stop_all quiet
            die "$name not ready after ${CP_TIMEOUT}s; see $DIR/logs/$name.log"
        fi
        sleep 0.5
    done
}

gen_pki() {
    local pki=$DIR/pki
    mkdir -p "$pki"
    if [[ -f $pki/ca.crt && -f $pki/apiserver.crt && -f $pki/sa.key && -f $pki/sa.pub \
          && -f $pki/token && -f $pki/kubelet-client.crt ]]; then
        return 0
    fi
    log "generating CA, serving certificate, service-account key and admin token in $pki"
    (
        cd "$pki"
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
            -subj "/CN=tessera-local-ca" 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
            -subj "/CN=kube-apiserver" 2>/dev/null
        printf '%s\n' \
            "subjectAltName=IP:127.0.0.1,IP:$POD_SIDE_ADDRESS,IP:${SERVICE_CIDR%.*}.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" \
            "extendedKeyUsage=serverAuth" "keyUsage=digitalSignature,keyEncipherment" >apiserver.ext
        openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -out apiserver.crt -days 3650 -extfile apiserver.ext 2>/dev/null
        # the apiserver's client certificate towards kubelets (logs, exec): scripts/node.sh's kubelets
        # accept clients of this CA only
        openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr \
            -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
        printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=digitalSignature,keyEncipherment" >kubelet-client.ext
        openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
            -out kubelet-client.crt -days 3650 -extfile kubelet-client.ext 2>/dev/null
        openssl genrsa -out sa.key 2048 2>/dev/null
        openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
        openssl rand -hex 24 >token
        echo "$(cat token),admin,admin,system:masters" >tokens.csv
        chmod 600 ./*.key token tokens.csv
    ) || die "openssl failed while generating $pki"
}

write_kubeconfig() {
    local port=$1 host=$2
    cat >"$DIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tessera-local
  cluster:
    server: https://$host:$port
    certificate-authority: $DIR/pki/ca.crt
users:
- name: admin
  user:
    token: $(cat "$DIR/pki/token")
contexts:
- name: tessera-local
  context:
    cluster: tessera-local
    user: admin
    namespace: default
current-context: tessera-local
EOF
    chmod 600 "$DIR/kubeconfig"
}

find_yaml_python() {
    local c
    for c in "${TESSERA_PYTHON:-}" "$SCRIPT_DIR/../.venv/bin/python" python3; do
        [[ -n $c ]] || continue
        if "$c" -c 'import yaml' 2>/dev/null; then echo "$c"; return 0; fi
    done
    return 1
}

# render_scheduler_config SRC DEST HEALTHZ_PORT
render_scheduler_config() {
    local src=$1 dest=$2 hport=$3 py
    [[ -f $src ]] || die "scheduler config $src not found"
    sed "s#__KUBECONFIG__#$DIR/kubeconfig#g" "$src" >"$dest"
    if py=$(find_yaml_python); then
        "$py" - "$dest" "$DIR/kubeconfig" "127.0.0.1:$hport" <<'EOF' || die "cannot render $dest"
import sys, yaml
path, kubeconfig, addr = sys.argv[1:4]
with open(path) as f:
    cfg = yaml.safe_load(f)
if not isinstance(cfg, dict) or cfg.get("kind") != "KubeSchedulerConfiguration":
    sys.exit(f"{path}: not a KubeSchedulerConfiguration")
cc = cfg.setdefault("clientConnection", {}) or {}
cfg["clientConnection"] = cc
old = cc.get("kubeconfig")
if old not in (None, kubeconfig):
    print(f"[controlplane] note: clientConnection.kubeconfig {old} -> {kubeconfig}", file=sys.stderr)
cc["kubeconfig"] = kubeconfig
le = cfg.get("leaderElection") or {}
le["leaderElect"] = False
cfg["leaderElection"] = le
cfg["healthzBindAddress"] = addr
cfg["metricsBindAddress"] = addr
with open(path, "w") as f:
    yaml.safe_dump(cfg, f, sort_keys=False)
EOF
    else
        log "PyYAML not found: using $src with only __KUBECONFIG__ substituted"
        grep -q "$DIR/kubeconfig" "$dest" \
            || die "$src must set clientConnection.kubeconfig: __KUBECONFIG__ (no PyYAML to add it)"
        grep -q "healthzBindAddress: *127.0.0.1:$hport" "$dest" || {
            grep -Eq '^(healthzBindAddress|metricsBindAddress):' "$dest" \
                && die "$src sets healthz/metricsBindAddress; remove them (no PyYAML to rewrite)"
            printf 'healthzBindAddress: 127.0.0.1:%s\nmetricsBindAddress: 127.0.0.1:%s\n' \
                "$hport" "$hport" >>"$dest"
        }
    fi
}

any_running() {
    local name pid
    [[ -f $DIR/pids ]] || return 1
    while read -r name pid; do
        pid_alive "$pid" "$name" && return 0
    done <"$DIR/pids"
    return 1
}

# stop_all [quiet] : TERM then KILL every recorded pid, newest first.
stop_all() {
    local quiet=${1:-} name pid lines=() i waited
    if [[ ! -f $DIR/pids ]]; then
        [[ -n $quiet ]] || log "nothing to stop in $DIR"
        return 0
    fi
    mapfile -t lines <"$DIR/pids"
    for (( i = ${#lines[@]} - 1; i >= 0; i-- )); do
        read -r name pid <<<"${lines[i]}"
        if pid_alive "$pid" "$name"; then
            kill -TERM "$pid" 2>/dev/null || true
            waited=0
            while pid_alive "$pid" "$name" && (( waited < 100 )); do
                sleep 0.1; waited=$((waited + 1))
            done
            if pid_alive "$pid" "$name"; then
                kill -KILL "$pid" 2>/dev/null || true
                [[ -n $quiet ]] || log "killed $name (pid $pid) with SIGKILL"
            else
                [[ -n $quiet ]] || log "stopped $name (pid $pid)"
            fi
        fi
    done
    rm -f "$DIR/pids"
    # kube-proxy's iptables chains outlive it: remove them, or the next cluster's Services meet stale rules
    if [[ -f $DIR/kube-proxy.cleanup ]]; then
        "$(cat "$DIR/kube-proxy.cleanup")" --cleanup >>"$DIR/logs/kube-proxy.log" 2>&1 || true
        rm -f "$DIR/kube-proxy.cleanup"
    fi
}

cmd_start() {
    local sched_cfg=${1:-}
    local etcd_bin=${ETCD_BIN:-$(command -v etcd || true)}
    [[ -n $etcd_bin ]] || die "etcd not found (run scripts/kube-build.sh or apt-get install etcd-server)"
    [[ -x $KUBE_BIN/kube-apiserver ]] || die "$KUBE_BIN/kube-apiserver missing: run scripts/kube-build.sh"
    if [[ -n $sched_cfg ]]; then
        [[ -x $KUBE_BIN/kube-scheduler ]] || die "$KUBE_BIN/kube-scheduler missing: run scripts/kube-build.sh"
        sched_cfg=$(cd "$(dirname "$sched_cfg")" && pwd)/$(basename "$sched_cfg")
        [[ -f $sched_cfg ]] || die "scheduler config $sched_cfg not found"
    fi
    local pod_network=${CP_POD_NETWORK:-0}
    [[ $pod_network == 0 || $pod_network == 1 ]] || die "CP_POD_NETWORK='$pod_network' must be 0 or 1"
    local controllers=${CP_CONTROLLERS:-}
    local api_host=127.0.0.1 reconciler=none no_admission=ServiceAccount,TaintNodesByCondition
    if [[ $pod_network == 1 ]]; then
        [[ $(id -u) -eq 0 ]] || die "CP_POD_NETWORK=1 needs root (an address on lo, kube-proxy's iptables rules)"
        command -v iptables >/dev/null || die "CP_POD_NETWORK=1 needs iptables (kube-proxy): apt-get install iptables"
        [[ -x $KUBE_BIN/kube-proxy ]] || die "CP_POD_NETWORK=1 needs $KUBE_BIN/kube-proxy: run scripts/kube-build.sh (recipe r4)"
        controllers=${controllers:-$POD_NETWORK_CONTROLLERS}
        api_host=$POD_SIDE_ADDRESS reconciler=lease no_admission=TaintNodesByCondition
        ip -4 addr show dev lo | grep -q "inet $POD_SIDE_ADDRESS/" \
            || ip addr add "$POD_SIDE_ADDRESS/32" dev lo || die "cannot add $POD_SIDE_ADDRESS to lo"
    fi
    if [[ -n $controllers ]]; then
        [[ -x $KUBE_BIN/kube-controller-manager ]] \
            || die "CP_CONTROLLERS is set but $KUBE_BIN/kube-controller-manager is missing:" \
                   "run scripts/kube-build.sh (recipe r3 or later builds it)"
        [[ $controllers =~ ^[a-z*-]+(,[a-z*-]+)*$ ]] \
            || die "CP_CONTROLLERS='$controllers' is not a comma-separated list of controller names" \
                   "(e.g. job,garbagecollector, or '*', or '*,-nodelifecycle')"
    fi
    command -v curl >/dev/null || die "curl is required"
    command -v openssl >/dev/null || die "openssl is required"
    if any_running; then
        die "a control plane is already running from $DIR (pids in $DIR/pids); run: $0 stop $DIR"
    fi
    rm -f "$DIR/pids"
    mkdir -p "$DIR/logs" "$DIR/etcd" || die "cannot create $DIR"
    chmod 700 "$DIR/etcd"

    local t0 ports etcd_port peer_port api_port sched_port sched_hport kcm_port proxy_hport proxy_mport
    t0=$(date +%s.%N)
    ports=$(free_ports 8)
    read -r etcd_port peer_port api_port sched_port sched_hport kcm_port proxy_hport proxy_mport <<<"$ports"
    gen_pki
    # Render (and so validate) the scheduler config before anything is started.
    [[ -z $sched_cfg ]] || render_scheduler_config "$sched_cfg" "$DIR/scheduler-config.yaml" "$sched_hport"

    # Whatever fails from here on, do not leave half a control plane running.
    STARTING=1
    trap '[[ ${STARTING:-0} == 1 ]] && stop_all quiet' EXIT

    # --- etcd --------------------------------------------------------------
    launch etcd "$etcd_bin" \
        --name=tessera --data-dir="$DIR/etcd" \
        --listen-client-urls="http://127.0.0.1:$etcd_port" \
        --advertise-client-urls="http://127.0.0.1:$etcd_port" \
        --listen-peer-urls="http://127.0.0.1:$peer_port" \
        --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
        --initial-cluster="tessera=http://127.0.0.1:$peer_port" \
        --initial-cluster-state=new
    wait_for etcd etcd curl -sf "http://127.0.0.1:$etcd_port/health"

    # --- kube-apiserver ------------------------------------------------------
    write_kubeconfig "$api_port" "$api_host"
    launch kube-apiserver "$KUBE_BIN/kube-apiserver" \
        --etcd-servers="http://127.0.0.1:$etcd_port" \
        --bind-address="$api_host" --advertise-address="$api_host" \
        --secure-port="$api_port" --insecure-port=0 \
        --endpoint-reconciler-type="$reconciler" \
        --tls-cert-file="$DIR/pki/apiserver.crt" --tls-private-key-file="$DIR/pki/apiserver.key" \
        --cert-dir="$DIR/pki/apiserver-generated" \
        --client-ca-file="$DIR/pki/ca.crt" \
        --token-auth-file="$DIR/pki/tokens.csv" \
        --authorization-mode=RBAC \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-account-signing-key-file="$DIR/pki/sa.key" \
        --service-account-key-file="$DIR/pki/sa.pub" \
        --service-cluster-ip-range="$SERVICE_CIDR" \
        --disable-admission-plugins="$no_admission" \
        --allow-privileged=true \
        --kubelet-preferred-address-types=InternalIP,Hostname \
        --kubelet-client-certificate="$DIR/pki/kubelet-client.crt" \
        --kubelet-client-key="$DIR/pki/kubelet-client.key" \
        --v="$CP_VERBOSITY"
    wait_for kube-apiserver kube-apiserver \
        curl -sf --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $(cat "$DIR/pki/token")" \
        "https://$api_host:$api_port/readyz"

    # --- kube-scheduler (optional) ------------------------------------------
    local sched_health=
    if [[ -n $sched_cfg ]]; then
        launch kube-scheduler "$KUBE_BIN/kube-scheduler" \
            --config="$DIR/scheduler-config.yaml" \
            --bind-address=127.0.0.1 --secure-port="$sched_port" \
            --cert-dir="$DIR/pki/scheduler-generated" \
            --v="$CP_VERBOSITY"
        sched_health="http://127.0.0.1:$sched_hport/healthz"
        wait_for kube-scheduler kube-scheduler curl -sf "$sched_health"
    fi

    # --- kube-controller-manager (opt-in: CP_CONTROLLERS) --------------------
    # Loopback only: the deprecated insecure port (default 0.0.0.0:10252) is off
    # (--port=0); the secure port serves /healthz without authentication
    # (--authorization-always-allow-paths defaults to /healthz) and everything else
    # (/metrics) to a bearer token the apiserver accepts in a TokenReview and
    # SubjectAccessReview (the admin token). --authentication-skip-lookup: the
    # apiserver runs without a request-header CA, so the lookup of
    # kube-system/extension-apiserver-authentication would log an error forever.
    # The serving certificate is self-signed, written to --cert-dir.
    local kcm_health=
    if [[ -n $controllers ]]; then
        launch kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
            --kubeconfig="$DIR/kubeconfig" \
            --authentication-kubeconfig="$DIR/kubeconfig" \
            --authorization-kubeconfig="$DIR/kubeconfig" \
            --authentication-skip-lookup \
            --bind-address=127.0.0.1 --secure-port="$kcm_port" --port=0 \
            --cert-dir="$DIR/pki/controller-manager-generated" \
            --leader-elect=false \
            --controllers="$controllers" \
            --use-service-account-credentials=false \
            --service-account-private-key-file="$DIR/pki/sa.key" \
            --root-ca-file="$DIR/pki/ca.crt" \
            --cluster-signing-cert-file="$DIR/pki/ca.crt" \
            --cluster-signing-key-file="$DIR/pki/ca.key" \
            --service-cluster-ip-range="$SERVICE_CIDR" \
            --v="$CP_VERBOSITY"
        kcm_health="https://127.0.0.1:$kcm_port/healthz"
        wait_for kube-controller-manager kube-controller-manager curl -sfk "$kcm_health"
    fi

    # --- kube-proxy (CP_POD_NETWORK=1) ---------------------------------------
    # iptables mode; --masquerade-all: a pod reaching a Service whose endpoint sits on its own bridge
    # gets the reply through the host (no hairpin set-up on the CNI bridges). The conntrack settings
    # are left as the machine has them (0), since several nodes share this host.
    local proxy_health=
    if [[ $pod_network == 1 ]]; then
        launch kube-proxy "$KUBE_BIN/kube-proxy" \
            --kubeconfig="$DIR/kubeconfig" \
            --proxy-mode=iptables --cluster-cidr="$POD_CIDR" --masquerade-all \
            --hostname-override=tessera-controlplane \
            --bind-address=127.0.0.1 \
            --healthz-bind-address="127.0.0.1:$proxy_hport" --metrics-bind-address="127.0.0.1:$proxy_mport" \
            --conntrack-max-per-core=0 --conntrack-tcp-timeout-established=0 --conntrack-tcp-timeout-close-wait=0 \
            --v="$CP_VERBOSITY"
        proxy_health="http://127.0.0.1:$proxy_hport/healthz"
        wait_for kube-proxy kube-proxy curl -sf "$proxy_health"
        echo "$KUBE_BIN/kube-proxy" >"$DIR/kube-proxy.cleanup"
    fi

    cat >"$DIR/endpoints.env" <<EOF
export KUBECONFIG=$DIR/kubeconfig
export TESSERA_CP_APISERVER=https://$api_host:$api_port
export TESSERA_CP_ETCD=http://127.0.0.1:$etcd_port
export TESSERA_CP_SCHEDULER_HEALTHZ=$sched_health
export TESSERA_CP_CONTROLLER_MANAGER_HEALTHZ=$kcm_health
EOF
    STARTING=0
    local elapsed
    elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    log "control plane up in ${elapsed}s: apiserver https://$api_host:$api_port," \
        "etcd http://127.0.0.1:$etcd_port${sched_health:+, scheduler healthz $sched_health}${kcm_health:+,}" \
        "${kcm_health:+controller-manager ($controllers) healthz $kcm_health}"
    [[ -z $proxy_health ]] || log "kube-proxy (iptables) healthz $proxy_health; pods reach the apiserver at $api_host:$api_port"
    log "use: eval \"\$($0 env $DIR)\""
}

cmd_env() {
    [[ -f $DIR/kubeconfig ]] || die "$DIR/kubeconfig not found (start first)"
    if [[ -f $DIR/endpoints.env ]]; then
        cat "$DIR/endpoints.env"
    else
        echo "export KUBECONFIG=$DIR/kubeconfig"
    fi
}

cmd_status() {
    local name pid rc=1
    [[ -f $DIR/pids ]] || { echo "not running"; return 1; }
    while read -r name pid; do
        if pid_alive "$pid" "$name"; then echo "$name $pid running"; rc=0
        else echo "$name $pid dead"; fi
    done <"$DIR/pids"
    return $rc
}

[[ $# -ge 2 ]] || usage
sub=$1
DIR=$(abspath "$2")
shift 2
case $sub in
    start)  [[ $# -le 1 ]] || usage; cmd_start "$@" ;;
    stop)   [[ $# -eq 0 ]] || usage; stop_all ;;
    env)    [[ $# -eq 0 ]] || usage; cmd_env ;;
    status) [[ $# -eq 0 ]] || usage; cmd_status ;;
    *) usage ;;
esac
