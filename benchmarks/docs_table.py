"""``python -m benchmarks.docs_table [--check]``: the benchmark table of docs/benchmark.md, rendered from a results
JSON.

The table in docs/benchmark.md sits between ``<!-- bench:begin -->`` and ``<!-- bench:end -->``;
this replaces what is between them with the rows of ``benchmarks/results/latest.json`` (the rows the bench printed,
:func:`benchmarks.report.table_rows`, headed by the machine, date and commit, followed by the targets). So the
page's figures are the committed run's, never typed in. ``--check`` changes nothing and exits 1 if the page's
table is not the JSON's (a table edited by hand, or a JSON committed without regenerating it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.report import table_rows, target_lines
from benchmarks.runner import REPO

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
PAGE = REPO / "docs" / "benchmark.md"
LATEST = REPO / "benchmarks" / "results" / "latest.json"


class TableError(Exception):
    """A page without the markers, or a results file that is not one."""


def _cell(text: str) -> str:
    return text.strip().replace("|", "\\|")


def render(doc: dict[str, Any]) -> str:
    """The markdown between the markers: a line naming the run, the table, the targets."""
    m, options, commit = doc["machine"], doc["options"], doc.get("checkout") or {}
    sha = (commit.get("commit") or "unknown")[:12] + (" (uncommitted changes)" if commit.get("dirty") else "")
    load = ", ".join(str(v) for v in m.get("load_average", []))
    lines = [
        f"Run of {doc.get('date', 'unknown date')} from commit {sha}: {options['events']:,} orders over "
        f"{options['partitions']} partitions, {options['batch_records']:,} records per batch; {m['cpus']} CPUs, "
        f"{m['memory_gib']} GiB, {m['platform']}, Python {m['python']}, PySpark {m['pyspark']}, "
        f"pyiceberg {m.get('pyiceberg', '?')}, {m['broker']}"
        + (f"; load average {load} at the end" if load else "")
        + f"; {doc['seconds']:,} s in all.",
        "",
        "| measurement | result | detail |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {_cell(a)} | {_cell(b)} | {_cell(c)} |" for a, b, c in table_rows(doc)]
    lines += ["", "Targets:", ""] + [f"* {line}" for line in target_lines(doc)]
    return "\n".join(lines)


def replaced(page: str, table: str) -> str:
    """``page`` with ``table`` between the markers."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise TableError(f"no {BEGIN} ... {END} markers around the benchmark table")
    return page[: start + len(BEGIN)] + "\n" + table + "\n" + page[end:]


def load_results(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise TableError(f"no results at {path}: run python -m benchmarks (make bench) first") from None
    except json.JSONDecodeError as exc:
        raise TableError(f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or "targets" not in doc or "machine" not in doc:
        raise TableError(f"{path} is not a results file of python -m benchmarks (no machine or targets)")
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.docs_table", description=__doc__)
    parser.add_argument("--results", default=str(LATEST), help="results JSON (default: benchmarks/results/latest.json)")
    parser.add_argument("--page", default=str(PAGE), help="the page to update (default: docs/benchmark.md)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the table differs")
    args = parser.parse_args(argv)
    page_path = Path(args.page)
    try:
        text = page_path.read_text()
        new = replaced(text, render(load_results(Path(args.results))))
    except (TableError, OSError) as exc:
        print(f"docs_table: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(
                f"docs_table: the table in {page_path} is not the one of {args.results}; "
                "regenerate it with python -m benchmarks.docs_table",
                file=sys.stderr,
            )
            return 1
        return 0
    page_path.write_text(new)
    print(f"docs_table: {page_path} has the table of {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
