"""The layers point one way: core <- spark_jobs, outbox <- the application <- Dagster; harness and benchmark apart.

Every import of every module is read from its source (top level and inside functions alike), so a lazy import
that reaches upwards fails here too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNTIME = ("krishiv_core", "spark_jobs", "outbox", "krishiv", "krishiv_assets")
#: What each package may import of the project, besides itself.
ALLOWED = {
    "krishiv_core": set(),
    "spark_jobs": {"krishiv_core"},
    "outbox": {"krishiv_core"},
    "krishiv": {"krishiv_core", "spark_jobs", "outbox"},
    "krishiv_assets": {"krishiv_core", "spark_jobs", "outbox", "krishiv"},
}
PROJECT = {*RUNTIME, "chaos", "benchmarks", "tests"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & PROJECT


@pytest.mark.parametrize("package", RUNTIME)
def test_a_package_imports_only_the_layers_below_it(package: str):
    wrong = {
        str(path.relative_to(REPO)): sorted(_imports(path) - ALLOWED[package] - {package})
        for path in sorted((REPO / package).rglob("*.py"))
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_harness_and_the_benchmark_are_not_installed():
    text = (REPO / "pyproject.toml").read_text()
    assert '"chaos' not in text and '"benchmarks' not in text
    assert "matplotlib" not in text.split("[project.optional-dependencies]")[0]


def test_the_architecture_page_draws_the_layers_the_code_has():
    """docs/architecture.md's table of what each folder may import is this test's own ``ALLOWED``."""
    section = (REPO / "docs" / "architecture.md").read_text().split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    drawn = {}
    for folder, may_import in re.findall(r"^\| `(\w+)/` \| (.+) \|$", section, flags=re.MULTILINE):
        drawn[folder] = set(re.findall(r"`(\w+)/`", may_import))
    assert drawn == ALLOWED
