"""``python -m chaos``: the fault-injection harness: the crash-point matrix, then random scenarios (a soak).

It lives beside the runtime packages, not in them: it drives the real ``krishiv`` command as separate processes
(``python -m krishiv.cli``) and imports the application only to set up and check its world.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable

from chaos.runner import run_chaos
from chaos.scenarios import SIZES
from krishiv_core.errors import KrishivError

console = Console(highlight=False, soft_wrap=True)


def run(args: argparse.Namespace) -> int:

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt  # stops the harness through its cleanup: broker, PostgreSQL, running step

    signal.signal(signal.SIGTERM, interrupt)

    def show(s) -> None:
        mark = "[green]ok[/]" if not s.violations else f"[red]{len(s.violations)} violations[/]"
        console.print(f"{s.name}: {mark}, {s.faults} faults, {s.events_checked} events checked, {s.seconds:.0f}s")
        for v in s.violations:
            console.print(f"  - {v}")

    report = run_chaos(
        args.seed,
        args.duration,
        Path(args.state),
        args.scenario or None,
        on_scenario=show,
        report_path=Path(args.report),
        size=SIZES[args.size],
        keep=args.keep,
        lanes=args.lanes,
    )
    summary = report.summary()
    out = RichTable(title=f"fault injection, seed {args.seed}, {args.size} size, {args.lanes} lane(s)")
    for col in ("scenarios", "faults injected", "events checked", "violations", "time"):
        out.add_column(col)
    out.add_row(
        str(summary["scenarios_run"]),
        str(summary["faults_injected"]),
        str(summary["events_checked"]),
        str(summary["violations"]),
        f"{summary['seconds']:.0f}s",
    )
    console.print(out)
    console.print(f"fault points fired: {summary['fault_points_fired']}; report written to {args.report}")
    return 0 if not report.violations else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=0, help="seconds of random scenarios after the matrix")
    parser.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    parser.add_argument(
        "--size",
        choices=("full", "ci"),
        default="full",
        help="full (default, for soaks) or ci: fewer events, batches and repeated kills, every fault point still fired",
    )
    parser.add_argument("--state", default="state/chaos", help="working folder; failing scenarios are kept there")
    parser.add_argument("--keep", action="store_true", help="keep every scenario's folder, not only the failing ones")
    parser.add_argument(
        "--lanes", type=int, default=1, help="matrix scenarios run side by side (exclusive ones alone; default 1)"
    )
    parser.add_argument("--report", default="state/chaos/report.json")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except KrishivError as exc:
        Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]chaos: {exc}[/]")
        return 2


if __name__ == "__main__":
    sys.exit(main())
