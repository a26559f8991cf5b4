# Helpers that scripts/controlplane.sh and scripts/node.sh share; sourced, not run.
# The sourcing script sets LOG_PREFIX first (its name in brackets on every line it prints).

log() { printf '[%s] %s\n' "$LOG_PREFIX" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$LOG_PREFIX" "$*" >&2; exit 1; }

# usage_from FILE FIRST,LAST : print the header comment's lines FIRST..LAST as the usage, exit 2.
usage_from() {
    sed -n "$2p" "$1" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# free_ports N : print N distinct free TCP ports on 127.0.0.1.
free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
}
