"""`tessera certs`: the certificates mutual TLS between kube-scheduler and the extender needs (both install modes).

One private CA, made here and used for nothing else; a server certificate for the extender's
Service names (and any --dns/--ip given), which replicas also present as clients when a follower
forwards a bind to the holder; a client certificate for kube-scheduler. The extender requires a
client certificate signed by this CA on its verbs port, so holding `scheduler.key` (or `server.key`)
is what it means to be allowed to schedule. Made with the openssl command line (no new Python
dependency); EC P-256 keys, which Go's and Python's TLS both speak.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SERVICE = "tessera-extender"
NAMESPACE = "tessera-system"
FILES = ("ca.crt", "ca.key", "server.crt", "server.key", "scheduler.crt", "scheduler.key")


def service_names(service: str = SERVICE, namespace: str = NAMESPACE) -> list[str]:
    """The DNS names a client inside the cluster may use for the Service."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _openssl(*args: str, cwd: Path) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"openssl {args[0]} failed: {out.stderr.strip()[-400:]}")


def _valid_name(name: str) -> str:
    if not name or len(name) > 253 or any(not (c.isalnum() or c in "-.*") for c in name):
        raise ValueError(f"--dns {name!r} is not a DNS name")
    return name


def _valid_ip(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(text))
    except ValueError as e:  # ipaddress's words name the value, not the flag
        raise ValueError(f"--ip: {e}") from None


def make_certs(out: Path, dns: list[str] | None = None, ips: list[str] | None = None, days: int = 365,
               service: str = SERVICE, namespace: str = NAMESPACE) -> dict[str, Path]:
    """Write FILES into `out` (created; refused if any of them exists: a CA key is never overwritten)."""
    if not shutil.which("openssl"):
        raise ValueError("tessera certs needs the openssl command line tool")
    if not 1 <= days <= 3650:
        raise ValueError(f"--days {days}: between 1 and 3650")
    names = service_names(service, namespace) + [_valid_name(n) for n in dns or []]
    addresses = ["127.0.0.1", "::1"] + [_valid_ip(ip) for ip in ips or []]
    if out.exists() and not out.is_dir():  # mkdir said "[Errno 17] File exists" without naming the flag
        raise ValueError(f"--out {out} is a file; give a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot make the directory: {e.strerror or e}") from None
    clash = [f for f in FILES if (out / f).exists()]
    if clash:
        raise ValueError(f"{out} already holds {', '.join(clash)}: choose an empty directory (a CA is never overwritten)")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", str(days),
                 "-subj", f"/CN={service}-ca", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=work)
        san = ",".join([f"DNS:{n}" for n in names] + [f"IP:{a}" for a in addresses])
        leaves = {
            "server": (f"/CN={service}.{namespace}.svc", f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"),
            "scheduler": ("/CN=system:kube-scheduler", "extendedKeyUsage=clientAuth\n"),
        }
        for name, (subject, ext) in leaves.items():
            (work / f"{name}.ext").write_text(ext + "basicConstraints=critical,CA:FALSE\n"
                                              "keyUsage=critical,digitalSignature,keyEncipherment\n")
            _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=work)
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                     "-out", f"{name}.crt", "-days", str(days), "-extfile", f"{name}.ext", cwd=work)
        written = {}
        for f in FILES:
            target = out / f
            shutil.copyfile(work / f, target)
            os.chmod(target, 0o600 if f.endswith(".key") else 0o644)
            written[f] = target
    return written


def next_steps(out: Path, namespace: str = NAMESPACE) -> str:
    """What to do with the files (printed by `tessera certs`; docs/admin-guide.md says the same)."""
    return f"""wrote {', '.join(FILES)} to {out}
1. the extender's Secret, both modes (server certificate, its key, the CA that signs clients):
   kubectl -n {namespace} create secret generic tessera-extender-tls \\
     --from-file=tls.crt={out}/server.crt --from-file=tls.key={out}/server.key --from-file=ca.crt={out}/ca.crt
2. kube-scheduler's client certificate, where its kube-scheduler reads it:
   control-plane mode, on every control-plane node (the shipped scheduler config reads them there):
     install -d -m 0700 /etc/kubernetes/tessera
     install -m 0600 {out}/scheduler.crt {out}/scheduler.key {out}/ca.crt /etc/kubernetes/tessera/
   second-scheduler mode, the Secret the tessera-scheduler pods mount:
     kubectl -n {namespace} create secret generic tessera-scheduler-tls \\
       --from-file={out}/scheduler.crt --from-file={out}/scheduler.key --from-file={out}/ca.crt
3. keep {out}/ca.key offline: whoever holds it can mint a certificate kube-scheduler's way in."""
