"""The Krishiv component: a spec file's pipelines as definitions of the user's own Dagster project (``dg``).

``dg scaffold defs krishiv_assets.KrishivComponent ingest`` writes ``defs/ingest/defs.yaml``::

    type: krishiv_assets.KrishivComponent
    attributes:
      spec: krishiv.toml

and ``dg list defs``, ``dg check defs`` and ``dg dev`` then load every pipeline of that spec: the same assets,
checks, jobs, sensors and schedules as the repository's code location (:func:`krishiv_assets.definitions.defs`),
with the same resources (``kafka``, ``iceberg``, ``ledger``, ``spark``), which the project's own assets may use (a
downstream asset reads a Krishiv table through ``iceberg``; docs/dagster.md). A relative ``spec`` is read from the
project's root (the folder of its ``pyproject.toml``, where ``dg`` runs), and the spec's own relative paths (ledger,
checkpoints, warehouse) from the spec's folder, as the CLI reads them: ``krishiv run`` in the project's root and the
project's Dagster share one ledger and one set of tables.

The package registers this module with ``dg`` (the ``dagster_dg_cli.registry_modules`` entry point in
pyproject.toml), so ``dg list components`` names the component once Krishiv is installed in the project's
environment. Importing it loads no Krishiv module beyond this one: the definitions are built when Dagster loads them.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import BaseModel, Field

#: The spec file a scaffolded component names, relative to the project's root.
DEFAULT_SPEC = "krishiv.toml"


def spec_file(spec: str, project_root: Path) -> Path:
    """The spec file a component's ``spec`` names: relative to the project's root, unless absolute."""
    path = Path(spec).expanduser()
    return path if path.is_absolute() else project_root / path


class KrishivScaffoldParams(BaseModel):
    spec: str = Field(
        default=DEFAULT_SPEC,
        description="The Krishiv spec file, relative to the project's root (or absolute).",
    )


#: The project's Dagster home, relative to its root: Dagster's runs, event logs and sensor cursors, kept.
DAGSTER_HOME_FOLDER = ".dagster"
#: Krishiv's instance settings (the run queue, pools and launcher of docs/dagster.md), copied into that home.
INSTANCE_SETTINGS = Path(__file__).with_name("instance.yaml")


class KrishivScaffolder(dg.Scaffolder[KrishivScaffoldParams]):
    """Writes ``defs.yaml`` naming the spec, and gives the project a Dagster home of its own.

    ``dg dev`` without ``DAGSTER_HOME`` keeps the instance in a temporary folder it deletes on exit, so the runs,
    the materializations and the sensors' cursors would be forgotten at each start. Unless the project's ``.env``
    (which ``dg`` loads, and ``create-dagster`` keeps out of git) already sets ``DAGSTER_HOME``, the scaffold sets it
    there to the project's ``.dagster`` folder and writes Krishiv's instance settings into it (an existing
    ``dagster.yaml`` is left as it is). Each step it takes is printed.
    """

    @classmethod
    def get_scaffold_params(cls) -> type[KrishivScaffoldParams]:
        return KrishivScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[KrishivScaffoldParams]) -> None:
        from dagster.components.component_scaffolding import scaffold_component

        scaffold_component(request, {"spec": request.params.spec})
        root = request.project_root or Path.cwd()
        for line in dagster_home(root):
            print(f"krishiv: {line}")
        if not spec_file(request.params.spec, root).exists():
            print(
                f"krishiv: no spec at {request.params.spec} yet: write one in {root} with "
                "`krishiv init --topic TOPIC` before `dg check defs` (docs/quickstart.md)"
            )


def dagster_home(root: Path) -> list[str]:
    """Set ``DAGSTER_HOME`` in ``root/.env`` to ``root/.dagster`` (added to the project's ``.gitignore``) unless it is
    set there, and put Krishiv's instance settings in that home unless a ``dagster.yaml`` is there; what was done, a
    line each."""
    done = []
    env = root / ".env"
    lines = env.read_text(encoding="utf-8").splitlines() if env.exists() else []
    named = [line.split("=", 1)[1].strip().strip("'\"") for line in lines if line.startswith("DAGSTER_HOME=")]
    if named:
        home = Path(named[-1])
    else:
        home = (root / DAGSTER_HOME_FOLDER).resolve()
        env.write_text("\n".join([*lines, f"DAGSTER_HOME={home}", ""]), encoding="utf-8")
        done.append(f"{env}: DAGSTER_HOME={home} (Dagster's runs, event logs and sensor cursors, kept)")
        ignore = root / ".gitignore"  # create-dagster writes one: the instance's state is not the project's source
        kept = ignore.read_text(encoding="utf-8") if ignore.exists() else ""
        if f"{DAGSTER_HOME_FOLDER}/" not in kept.split():
            ignore.write_text(f"{kept.rstrip()}\n{DAGSTER_HOME_FOLDER}/\n".lstrip(), encoding="utf-8")
            done.append(f"{ignore}: {DAGSTER_HOME_FOLDER}/")
    settings = home / "dagster.yaml"
    if not settings.exists():
        home.mkdir(parents=True, exist_ok=True)
        settings.write_text(INSTANCE_SETTINGS.read_text(encoding="utf-8"), encoding="utf-8")
        done.append(f"{settings}: Krishiv's instance settings (run queue, pools, run launcher; docs/dagster.md)")
    return done


@dg.scaffold_with(KrishivScaffolder)
class KrishivComponent(dg.Component, dg.Resolvable, dg.Model):
    """Every pipeline of a Krishiv spec: its Kafka topics, staging and Iceberg table assets, their checks, the
    stage, commit and checks jobs, the Kafka and outbox sensors and the maintenance schedule."""

    spec: str = Field(
        default=DEFAULT_SPEC,
        description=(
            "The Krishiv spec file (krishiv.toml), relative to the project's root or absolute; its relative paths "
            "(ledger, checkpoints, warehouse) are read from its own folder."
        ),
    )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from krishiv_assets.definitions import spec_definitions
        from krishiv_core.errors import ConfigError, KrishivError

        path = spec_file(self.spec, context.project_root)
        if not path.is_file():
            raise ConfigError(
                "spec",
                f"no spec file at {path} (spec: {self.spec} in {context.path}): write one there with "
                "`krishiv init --topic TOPIC`, or name yours in that defs.yaml",
            )
        try:
            return spec_definitions(path)
        except KrishivError as exc:
            # The line the CLI prints, naming the file, without the parser's frames under Dagster's own traceback.
            raise ConfigError("spec", f"{path}: {exc}; `krishiv check` in {path.parent} says the same") from None
