"""`stitchfleet fleet quarantine list|clear|confirm`: an admin's view and word on the fleet's quarantine.

Input: the command's options (database URL, fingerprint, who and why). Output: `list` prints every
fingerprint with a standing or revert evidence (scope, jobs and namespaces, reason) and the latest
admin actions; `clear` and `confirm` write the standing with an audit Event
(telemetry.fleet_quarantine). Exit status 0 done, 2 for a bad argument or an unusable database;
errors are one line on stderr. Only the standard library at import: the CLI's parser loads it.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from stitchfleet import settings

EXIT_OK = 0
EXIT_USAGE = 2


def add_to(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `quarantine` to the `stitchfleet fleet` subcommands."""
    parser = actions.add_parser("quarantine", help="the fleet's quarantine of reverted clusters: list, clear, confirm")
    verbs = parser.add_subparsers(dest="quarantine_action", required=True)
    listing = verbs.add_parser("list", help="every fingerprint with a standing or revert evidence, and the audit trail")
    listing.add_argument("--db", default=None, help="SQLAlchemy URL (default: STITCHFLEET_DB_URL or SQLite)")
    listing.set_defaults(handler=run_list)
    for verb, text in (
        ("clear", "clear a fingerprint fleet-wide (evidence before now no longer counts)"),
        ("confirm", "make a fingerprint reverted fleet-wide"),
    ):
        action = verbs.add_parser(verb, help=text)
        action.add_argument("fingerprint")
        action.add_argument("--reason", required=True, help="why (kept in the audit trail)")
        action.add_argument("--by", default=None, help="who (default: the login name)")
        action.add_argument("--db", default=None, help="SQLAlchemy URL (default: STITCHFLEET_DB_URL or SQLite)")
        action.set_defaults(handler=run_act, verb=verb)


def run_list(args: argparse.Namespace) -> int:
    """Prints the quarantine and the audit trail."""
    from stitchfleet.telemetry import database, fleet_quarantine

    try:
        engine = database.connect(database.resolve_url(args.db))
        try:
            rule = fleet_quarantine.Rule(min_jobs=settings.current().slower_jobs)
            listed, trail = fleet_quarantine.entries(engine, rule), fleet_quarantine.audit_trail(engine)
        finally:
            engine.dispose()
    except Exception as err:
        print(f"stitchfleet fleet quarantine list: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{'fingerprint':<24} {'scope':<13} {'jobs':>4}  namespaces / reason")
    for entry in listed:
        jobs = len({(item.namespace, item.job_uid) for item in entry.evidence})
        where = ",".join(entry.namespaces) or "-"
        print(f"{entry.fingerprint:<24} {entry.scope:<13} {jobs:>4}  {where}  {entry.reason}".rstrip())
    if trail:
        print("\naudit trail (newest first):")
        for at, kind, fingerprint, detail in trail:
            print(f"  {at:%Y-%m-%d %H:%M} UTC  {kind:<21} {fingerprint}  {detail}")
    return EXIT_OK


def run_act(args: argparse.Namespace) -> int:
    """Clears or confirms one fingerprint, with who and why."""
    from stitchfleet.telemetry import database, fleet_quarantine

    actor = args.by or getpass.getuser()
    act = fleet_quarantine.clear if args.verb == "clear" else fleet_quarantine.confirm
    try:
        engine = database.connect(database.resolve_url(args.db))
        try:
            act(engine, args.fingerprint, actor=actor, why=args.reason, cluster=settings.current().cluster)
        finally:
            engine.dispose()
    except Exception as err:
        print(f"stitchfleet fleet quarantine {args.verb}: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.fingerprint}: {'cleared' if args.verb == 'clear' else 'reverted'} fleet-wide by {actor}")
    return EXIT_OK


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
