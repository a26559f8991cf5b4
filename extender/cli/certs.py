"""`tessera certs`: a CA and certificates for mutual TLS between kube-scheduler and the extender (extender/certs.py
makes them with openssl).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import namespace_name


def add_certs_command(sub) -> None:
    certs = sub.add_parser("certs", help="make a CA, the extender's server certificate and kube-scheduler's client one",
                           description="Make the certificates mutual TLS needs (openssl): ca.crt/key, server.crt/key "
                           "(the extender Service's DNS names, 127.0.0.1, ::1, and any --dns/--ip), scheduler.crt/key "
                           "(kube-scheduler's client certificate). Prints how to load them.")
    certs.add_argument("--out", type=Path, required=True,
                       help="a directory, made if missing; a CA or certificate already there is never overwritten")
    certs.add_argument("--dns", action="append", default=[], help="another DNS name for the server certificate; repeatable")
    certs.add_argument("--ip", action="append", default=[], help="another IP address for the server certificate; repeatable")
    certs.add_argument("--days", type=int, default=365, help="validity (default 365)")
    certs.add_argument("--namespace", type=namespace_name, default="tessera-system",
                       help="the extender's namespace (its Service DNS names; default tessera-system)")
    certs.set_defaults(run=cmd_certs)



def cmd_certs(args: argparse.Namespace) -> int:
    from ..certs import make_certs, next_steps

    make_certs(args.out, dns=args.dns, ips=args.ip, days=args.days, namespace=args.namespace)
    print(next_steps(args.out, args.namespace))
    return 0
