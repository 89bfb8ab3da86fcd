"""`raybroker cert create|list|export`: a running broker's certificates from the command line
(on the cluster of $RAY_ADDRESS). A broker makes its own services' key pairs itself and keeps
the private keys sealed under its master key; what leaves it is the public certificate, for the
far side to import (`cert create ... --from FILE`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

from actors.security import certificates

NAMESPACE = "raybroker"


def add_parsers(sub: Any) -> None:
    cert = sub.add_parser("cert", help="a broker's certificates: make, import, list, export")
    verbs = cert.add_subparsers(dest="verb", required=True)
    create = verbs.add_parser(
        "create", help="make a service's certificate on the broker, or import a far one"
    )
    create.add_argument("broker", help="the running broker's name")
    create.add_argument("name", help="the certificate's name in the broker's catalog")
    how = create.add_mutually_exclusive_group(required=True)
    how.add_argument("--owner", help="a service of the broker: make its key pair there")
    how.add_argument("--from", dest="pem_file", help="a PEM file: import someone's certificate")
    create.add_argument("--days", type=float, default=365.0, help="validity (default 365)")
    create.add_argument("--subject", default="", help="common name (default: the owner)")
    listing = verbs.add_parser("list", help="the broker's certificates and their validity")
    listing.add_argument("broker", help="the running broker's name")
    export = verbs.add_parser("export", help="a certificate's public PEM, for the far side")
    export.add_argument("broker", help="the running broker's name")
    export.add_argument("name", help="the certificate's name")
    export.add_argument("--out", help="write it to this file (default: print it)")
    for p in (create, listing, export):
        p.add_argument("--namespace", default=NAMESPACE)
    create.set_defaults(fn=_create)
    listing.set_defaults(fn=_list)
    export.set_defaults(fn=_export)


def table(records: Iterable[Mapping[str, Any]], now: float) -> list[str]:
    """Certificate records (as a broker's definitions show them) as lines for people."""
    rows = [("NAME", "OWNER", "SUBJECT", "VALID FROM", "UNTIL", "STATE", "KEY", "SHA-256")]
    for r in records:
        info = certificates.read(r["certificate"], f"certificate {r['name']!r}")
        why = certificates.invalid_at(info, now)
        state = "valid" if why is None else ("expired" if "expired" in why else "not yet valid")
        rows.append((
            r["name"],
            r.get("owner") or "-",
            info.subject,
            _day(info.not_before),
            _day(info.not_after),
            state,
            "private" if r.get("has_private_key") else "public",
            info.fingerprint[:16],
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]  # fmt: skip


def _day(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


def _certificates(broker: Any) -> list[dict[str, Any]]:
    return [r for kind, r in broker.definitions() if kind == "certificate"]


def _broker(args: argparse.Namespace) -> Any:
    from actors.remote.client import connect
    from actors.remote.runtime import ensure_ray

    ensure_ray()
    return connect(args.broker, args.namespace)


def _create(args: argparse.Namespace) -> int:
    from actors.model.credentials import Certificate

    if args.pem_file:
        try:
            with open(args.pem_file) as f:
                pem = f.read()
        except OSError as exc:
            print(f"raybroker cert: cannot read {args.pem_file!r}: {exc}", file=sys.stderr)
            return 2
        defn = Certificate(args.name, pem, subject=args.subject)
    else:
        defn = Certificate(args.name, owner=args.owner, subject=args.subject, days=args.days)
    broker = _broker(args)
    broker.create(defn)
    made = next(r for r in _certificates(broker) if r["name"] == args.name)
    print("\n".join(table([made], time.time())))
    return 0


def _list(args: argparse.Namespace) -> int:
    print("\n".join(table(_certificates(_broker(args)), time.time())))
    return 0


def _export(args: argparse.Namespace) -> int:
    found = [r for r in _certificates(_broker(args)) if r["name"] == args.name]
    if not found:
        print(f"raybroker cert: broker {args.broker!r} has no certificate {args.name!r}",
              file=sys.stderr)  # fmt: skip
        return 1
    pem = found[0]["certificate"]
    if args.out:
        with open(args.out, "w") as f:
            f.write(pem)
        print(f"wrote {args.out}")
    else:
        print(pem, end="")
    return 0
