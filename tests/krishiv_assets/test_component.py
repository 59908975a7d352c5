"""The component's scaffold gives a project a Dagster home with Krishiv's instance settings, and keeps a user's own.

The end-to-end path (create-dagster, dg scaffold, dg check, dg dev) is tests/krishiv_assets/test_dagster_project.py.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from krishiv_assets.component import INSTANCE_SETTINGS, dagster_home

ROOT = Path(__file__).resolve().parents[2]
#: Where the repository's instance keeps its state (state/dagster); a project's instance keeps it in its home.
STORAGE = {"storage", "local_artifact_storage", "compute_logs"}


def test_the_packaged_instance_settings_are_the_repositorys_but_for_where_state_is_kept() -> None:
    repository = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    packaged = yaml.safe_load(INSTANCE_SETTINGS.read_text())
    assert packaged == {k: v for k, v in repository.items() if k not in STORAGE}


def test_the_scaffold_sets_the_projects_dagster_home_once(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("SOMETHING=1\n")
    (tmp_path / ".gitignore").write_text(".env\n.venv")
    said = dagster_home(tmp_path)
    home = tmp_path / ".dagster"
    assert (tmp_path / ".env").read_text() == f"SOMETHING=1\nDAGSTER_HOME={home}\n"
    assert (tmp_path / ".gitignore").read_text() == ".env\n.venv\n.dagster/\n"
    assert (home / "dagster.yaml").read_text() == INSTANCE_SETTINGS.read_text()
    assert len(said) == 3 and str(home) in said[0]
    assert dagster_home(tmp_path) == []  # a second scaffold changes nothing


def test_a_users_own_dagster_home_and_settings_are_kept(tmp_path: Path) -> None:
    own = tmp_path / "elsewhere"
    own.mkdir()
    (own / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (tmp_path / ".env").write_text(f'DAGSTER_HOME="{own}"\n')
    assert dagster_home(tmp_path) == []
    assert (own / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"
    assert not (tmp_path / ".dagster").exists() and not (tmp_path / ".gitignore").exists()
