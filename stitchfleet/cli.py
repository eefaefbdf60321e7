"""The `stitchfleet` command: one entry point, one subcommand per user task.

Input: argv. Output: an exit status and what the subcommand prints. Subcommands
import their component lazily, so `stitchfleet --help` needs only numpy. A
subcommand whose issue has not landed yet says so plainly and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from stitchfleet import __version__, settings

if TYPE_CHECKING:
    from stitchfleet.compiler import ir

Handler = Callable[[argparse.Namespace], int]

EXIT_USAGE = 2


def _not_yet(what: str, issue: str) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        print(f"stitchfleet {what}: not available yet; it lands with the issue '{issue}'.", file=sys.stderr)
        return EXIT_USAGE

    return handler


def _show_settings(args: argparse.Namespace) -> int:
    current = settings.load()
    rows = settings.describe()
    width = max(len(name) for name, *_ in rows)
    area = ""
    for name, kind, default, doc in rows:
        field_name = name.removeprefix(settings.PREFIX).lower()
        if settings.area_of(field_name) != area:
            print(("\n" if area else "") + f"# {settings.area_of(field_name)}")
            area = settings.area_of(field_name)
        value = getattr(current, field_name)
        print(f"{name:<{width}}  {kind:<12} {value!s:<28} {doc}")
        if str(value) != default:
            print(f"{'':<{width}}  {'':<12} (default: {default})")
    return 0


def _add_settings(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("settings", help="show every STITCHFLEET_* setting, its value and meaning")
    parser.set_defaults(handler=_show_settings)


def _device_help() -> str:
    """The compile command's devices: the reference and every target that runs on any machine (the registry)."""
    from stitchfleet.compiler import targets

    runs = ", ".join(f"'{name}' ({targets.profile(name).summary})" for name in targets.names(checks_here=True))
    return f"run the graph and check it: 'reference' (numpy evaluate) or the stitched code of a target: {runs}"


def _demo_backends() -> tuple[str, ...]:
    """The backends a job may choose that run on the CPU (the demo trains on the CPU)."""
    from stitchfleet.compiler import targets

    return targets.names(runs_on="cpu", in_jobs=True)


def _add_compile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("compile", help="compile a graph (IR JSON or GraphDef) and report clusters and kernels")
    parser.add_argument("path", help="graph file: IR .json, or a TensorFlow GraphDef .pb (binary) or .pbtxt (text)")
    parser.add_argument("--report", choices=("json", "table"), default="table")
    parser.add_argument(
        "--device",
        default=None,
        help=_device_help(),
    )
    parser.add_argument(
        "--ptxas",
        metavar="ARCH",
        default=None,
        help="add what ptxas made of every stitched kernel for ARCH (sm_90): registers, spills, shared memory,"
        " occupancy against the plan, grid-barrier headroom (needs nvcc, no GPU)",
    )
    parser.set_defaults(handler=_compile)


def _graph_from_graphdef(path: str) -> tuple[ir.Graph, frozenset[int]] | int:
    """IR from a TensorFlow GraphDef file through the plugin's frontend and its op origins (the compiler draws
    clusters at TF op granularity from them, as in a job), or an exit status."""
    try:
        from stitchfleet.plugin.frontend import FrontendError, graphdef_file
    except ImportError as err:
        print(f"stitchfleet compile: {path}: GraphDef input needs TensorFlow ({err})", file=sys.stderr)
        return EXIT_USAGE
    try:
        conversion = graphdef_file.convert_file(path)
        return conversion.graph, frozenset(conversion.origins)
    except FrontendError as err:
        print(f"stitchfleet compile: {err}", file=sys.stderr)
        return EXIT_USAGE


def _compile(args: argparse.Namespace) -> int:
    from stitchfleet.compiler import compile_command

    current = settings.current()
    budget, dump_dir = current.remote_stitch_budget, current.dump_dir or None
    if not args.path.endswith(compile_command.GRAPHDEF_SUFFIXES):
        return compile_command.run(
            args.path, args.report, args.device, budget, dump_dir, cache_dir=current.cache_dir, ptxas=args.ptxas
        )
    bad_device = compile_command.check_device(args.device)
    if bad_device is not None:
        return bad_device
    converted = _graph_from_graphdef(args.path)
    if isinstance(converted, int):
        return converted
    graph, origins = converted
    return compile_command.run_graph(
        graph,
        args.report,
        args.device,
        budget,
        dump_dir,
        cache_dir=current.cache_dir,
        origins=origins,
        ptxas=args.ptxas,
    )


def _migrate_db(args: argparse.Namespace) -> int:
    from stitchfleet.telemetry import database

    url = database.resolve_url(args.db)
    try:
        database.parse_url(url)
        migrate = database.upgrade if args.db_action == "upgrade" else database.downgrade
        migrate(url, args.revision)
    except Exception as err:  # a migration can fail in many driver-specific ways: report, never trace
        print(f"stitchfleet db {args.db_action}: {database.describe_failure(url, err)}", file=sys.stderr)
        return 1
    print(f"stitchfleet db {args.db_action}: {database.safe_url(url)} is at revision {args.revision}")
    return 0


def _add_db(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("db", help="telemetry database maintenance")
    actions = parser.add_subparsers(dest="db_action", required=True)
    upgrade = actions.add_parser("upgrade", help="create or migrate the telemetry schema")
    upgrade.add_argument("--db", default=None, help="SQLAlchemy URL (default: STITCHFLEET_DB_URL or SQLite)")
    upgrade.add_argument("--revision", default="head", help="target schema revision (default: head)")
    upgrade.set_defaults(handler=_migrate_db)
    downgrade = actions.add_parser("downgrade", help="migrate the telemetry schema down (base: drop its tables)")
    downgrade.add_argument("--db", default=None, help="SQLAlchemy URL (default: STITCHFLEET_DB_URL or SQLite)")
    downgrade.add_argument("--revision", default="base", help="target schema revision (default: base)")
    downgrade.set_defaults(handler=_migrate_db)


def _add_telemetry(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("telemetry", help="telemetry data: load spooled rows into a database")
    actions = parser.add_subparsers(dest="telemetry_action", required=True)
    ingest = actions.add_parser("ingest", help="load a spool directory into a database (loading twice changes nothing)")
    ingest.add_argument("spool_dir", type=Path, metavar="SPOOL_DIR", help="directory of *.jsonl spool files")
    ingest.add_argument("--db", default=None, help="SQLAlchemy URL (default: STITCHFLEET_DB_URL or SQLite)")
    ingest.set_defaults(handler=_ingest_spool)


def _ingest_spool(args: argparse.Namespace) -> int:
    from stitchfleet.telemetry import database, spool_ingest

    url = database.resolve_url(args.db)
    try:
        database.parse_url(url)
        summary = spool_ingest.load(args.spool_dir, url)
    except FileNotFoundError as err:
        print(f"stitchfleet telemetry ingest: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # driver-specific failures: report which database and why, never trace
        print(f"stitchfleet telemetry ingest: {database.describe_failure(url, err)}", file=sys.stderr)
        return 1
    for note in summary.problems:
        print(f"stitchfleet telemetry ingest: {note}", file=sys.stderr)
    for path in summary.busy:
        print(f"stitchfleet telemetry ingest: {path}: skipped, its writer is still running", file=sys.stderr)
    print(
        f"stitchfleet telemetry ingest: {summary.rows} rows from {summary.files} files into {database.safe_url(url)}"
        f" ({len(summary.problems)} bad lines skipped, {len(summary.busy)} files still being written)"
    )
    return 0


def _add_recheck(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    recheck = actions.add_parser(
        "recheck", help="judge a quarantined cluster's reverts again in float64; clear it when all pass"
    )
    recheck.add_argument("fingerprint", metavar="FINGERPRINT", help="the cluster fingerprint")
    recheck.add_argument("--db", default=None, help="SQLAlchemy URL (default: STITCHFLEET_DB_URL or SQLite)")
    recheck.add_argument("--by", default=os.environ.get("USER", "unknown"), help="who clears (the audit event)")
    recheck.add_argument("--why", default="offline recheck", help="why (the audit event)")
    recheck.add_argument("--evidence", type=Path, default=None, help="the evidence blob (.npz) when not inline")
    recheck.set_defaults(handler=_fleet_recheck)


def _fleet_recheck(args: argparse.Namespace) -> int:
    from stitchfleet.plugin.guard import recheck
    from stitchfleet.telemetry import database

    url = database.resolve_url(args.db)
    try:
        done = recheck.recheck(args.fingerprint, url, args.by, args.why, args.evidence)
    except Exception as err:  # driver-specific failures: report which database and why, never trace
        print(f"stitchfleet fleet recheck: {database.describe_failure(url, err)}", file=sys.stderr)
        return 1
    print(done.describe())
    return 0 if done.cleared else 1


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("report", help="savings reports")
    kinds = parser.add_subparsers(dest="report_kind", required=True)
    weekly = kinds.add_parser("weekly", help="weekly GPU-hour savings report")
    weekly.add_argument("--week", default=None, help="ISO week, e.g. 2026-W47 (default: the current week)")
    weekly.add_argument("--format", choices=("md", "csv", "html"), default="md")
    weekly.add_argument("--db", default=None, help="SQLAlchemy URL (default: STITCHFLEET_DB_URL or SQLite)")
    weekly.add_argument("--output", "-o", default=None, type=Path, help="write the report to FILE (default: stdout)")
    weekly.add_argument(
        "--csv-table",
        # The names of report_command.CSV_TABLES (a test holds them equal), not imported from it: that module loads
        # SQLAlchemy, and building the parser must not.
        choices=("jobs", "rollups", "checks"),
        default="jobs",
        help="with --format csv: one row per task (jobs), per namespace/team/model plus fleet totals (rollups), "
        "or per job of the held-out check against its holdout runs (checks)",
    )
    weekly.add_argument(
        "--top",
        type=int,
        default=25,
        metavar="N",
        help="md/html: list the N tasks saving most and the N saving least, per device kind (default: 25; "
        "the jobs CSV lists every task)",
    )
    weekly.set_defaults(handler=_report_weekly)


def _report_weekly(args: argparse.Namespace) -> int:
    from stitchfleet.telemetry import report_command

    if args.top < 1:
        print(f"stitchfleet report weekly: --top {args.top}: expected 1 or more", file=sys.stderr)
        return EXIT_USAGE
    options = report_command.WeeklyOptions(args.db, args.week, args.format, args.csv_table, args.top, args.output)
    return report_command.run_weekly(options)


def _add_fleet(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from stitchfleet.telemetry import quarantine_command

    parser = sub.add_parser("fleet", help="the fleet's memory: the quarantine of reverted clusters")
    actions = parser.add_subparsers(dest="fleet_action", required=True)
    quarantine_command.add_to(actions)
    _add_recheck(actions)


def _add_operator(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("operator", help="run the Kubernetes operator and admission webhook")
    parser.set_defaults(handler=_operator)
    steps = parser.add_subparsers(dest="operator_step", required=False)
    secret = steps.add_parser(
        "password-secret",
        help="create the bundled PostgreSQL's password Secret unless it exists (the operator pod's init container)",
    )
    secret.add_argument("name", help="the Secret's name, in STITCHFLEET_OPERATOR_NAMESPACE")
    secret.set_defaults(handler=_password_secret)


def _password_secret(args: argparse.Namespace) -> int:
    from stitchfleet.operator import password_secret, process

    current = settings.current()
    namespace, timeout = current.operator_namespace, current.api_timeout_seconds
    try:
        created = password_secret.ensure(process.kube_api_client(), namespace, args.name, timeout=timeout)
    except Exception as err:  # the API unreachable or refusing: the init container fails, the kubelet retries
        print(f"stitchfleet operator password-secret: {err}", file=sys.stderr)
        return 1
    print(f"Secret {namespace}/{args.name}: {'created' if created else 'exists, kept as it is'}")
    return 0


def _operator(args: argparse.Namespace) -> int:
    from stitchfleet.operator import process, savings
    from stitchfleet.telemetry import database

    current = settings.current()
    engine = database.connect(current.database_url)
    try:
        status = process.run(current, savings.ledger_summarizer(engine))
    except database.DatabaseError as err:
        print(f"stitchfleet operator: {err}", file=sys.stderr)
        status = 1
    finally:
        engine.dispose()
    return process.leave(status)  # may end the process here: threads abandoned on SIGTERM (process.leave)


# The harnesses live in the repository's `benchmarks` package (with its suite, models and workloads),
# not in the installed package: `stitchfleet bench` runs from the repository root.
_BENCH_COMMANDS = {
    "gpu": ("benchmarks.harness.gpu_command", "stitched CUDA kernels vs per_op, JAX jit, torch.compile, copy"),
    "cpu": ("benchmarks.cpu_harness.command", "stitched C + OpenMP (cpu backend) vs plain TensorFlow, per cluster"),
}
# The kind's parser never treats an argument as an option: the harness's own parser (the one its
# script uses) parses them, --help included, so the options are defined once.
_NO_PREFIX = "\x00"


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("bench", help="run a benchmark harness: gpu or cpu (run from the repository root)")
    kinds = parser.add_subparsers(dest="bench_kind", metavar="KIND")
    for kind, (_, summary) in _BENCH_COMMANDS.items():
        harness = kinds.add_parser(
            kind, help=f"{summary}; --help lists its options", prefix_chars=_NO_PREFIX, add_help=False
        )
        harness.add_argument("options", nargs="*", metavar="OPTION", help="the harness's options (see --help)")
        harness.set_defaults(handler=_bench)
    parser.set_defaults(handler=_bench_usage(parser))


def _bench_usage(parser: argparse.ArgumentParser) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    return handler


def _import_harness(module: str) -> ModuleType | None:
    """The harness module, also under the console script (whose sys.path lacks the working directory)."""
    import importlib

    root = Path.cwd()
    if (root / "benchmarks" / "harness").is_dir() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or not (module == err.name or module.startswith(f"{err.name}.")):
            raise  # a missing dependency of the harness, not a missing harness: show it
        return None


def _bench(args: argparse.Namespace) -> int:
    module_name = _BENCH_COMMANDS[args.bench_kind][0]
    prog = f"stitchfleet bench {args.bench_kind}"
    harness = _import_harness(module_name)
    if harness is None:
        print(
            f"{prog}: the benchmark harness ({module_name}) is not importable here: run it from the root of the"
            " stitchfleet repository (the folder that holds benchmarks/)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    status: int = harness.main(args.options, prog=prog)
    return status


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("demo", help="train a small model with the plugin on and print the savings report")
    parser.add_argument("--steps", type=int, default=12000, help="training steps (default 12000)")
    parser.add_argument("--every", type=int, default=500, help="a progress line every N steps (default 500)")
    parser.add_argument("--dir", default="stitchfleet-demo", help="where each run's directory is made")
    parser.add_argument("--backend", default="cpu", choices=_demo_backends(), help="kernel backend (default cpu)")
    parser.add_argument(
        "--job-steps", type=int, default=None, help="the job's length the plugin is told (default --steps; 0: unknown)"
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=None,
        help="the plain step time the plugin is told (default: plain TF's first chunk in this run; 0: unknown)",
    )
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.every < 1:
        print("stitchfleet demo: --steps and --every must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.step_ms is not None and args.step_ms < 0:
        print(f"stitchfleet demo: --step-ms must be 0 (unknown) or more, got {args.step_ms}", file=sys.stderr)
        return EXIT_USAGE
    from stitchfleet.demo import command

    return command.run(args)


def _install_shim(args: argparse.Namespace) -> int:
    from stitchfleet.boot import installer

    try:
        done = installer.install(Path(args.dir))
    except OSError as err:
        print(f"stitchfleet shim install: cannot install into {args.dir}: {err}", file=sys.stderr)
        return 1
    print(f"installed stitchfleet {__version__} ({done.files} files) into {done.package_dir.parent}")
    print(f"boot shim: {done.shim_file} (put {done.shim_file.parent} first on PYTHONPATH)")
    if not args.with_op:
        return 0
    try:
        from stitchfleet.plugin.native.dispatch_op import build_prebuilt

        # Both builds of this TF version: the CPU wheel's and the GPU wheel's (-DGOOGLE_CUDA=1, its own name),
        # which loads and runs under the `tensorflow` GPU wheel of the same version (dispatch_op.prebuilt_name).
        built = [build_prebuilt(Path(args.dir), gpu=gpu) for gpu in (False, True)]
    except Exception as err:  # no TensorFlow or no compiler here: say which, and fail the image build
        print(f"stitchfleet shim install: cannot prebuild the native TF op: {err}", file=sys.stderr)
        return 1
    print(f"native TF op prebuilt for this TensorFlow version (CPU and GPU builds): {', '.join(map(str, built))}")
    return 0


def _add_shim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("shim", help="the boot shim that loads stitchfleet into a job's Python processes")
    actions = parser.add_subparsers(dest="shim_action", required=True)
    install = actions.add_parser("install", help="copy the package and its sitecustomize shim into DIR")
    install.add_argument("dir", metavar="DIR", help="target directory, e.g. /opt/stitchfleet")
    install.add_argument(
        "--with-op",
        action="store_true",
        help="also build the native TF op for the TensorFlow version installed here, for its CPU and GPU wheels, into"
        " DIR/ops (pods then need no C++ compiler)",
    )
    install.set_defaults(handler=_install_shim)


_COMMANDS = (
    _add_settings,
    _add_compile,
    _add_db,
    _add_telemetry,
    _add_fleet,
    _add_report,
    _add_operator,
    _add_bench,
    _add_demo,
    _add_shim,
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser; exposed for tests and documentation."""
    parser = argparse.ArgumentParser(
        prog="stitchfleet",
        description="Operator stitching for TensorFlow training jobs, with a numeric guard and proven savings.",
    )
    parser.add_argument("--version", action="version", version=f"stitchfleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one subcommand; returns its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return handler(args)
    except settings.SettingsError as err:
        print(f"stitchfleet: bad setting: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
