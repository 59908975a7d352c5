"""Krishiv's Dagster side: the definitions of a spec (the repository's code location, ``definitions.py``), the
component that adds them to a Dagster project of one's own (``KrishivComponent``, ``component.py``), and what a
downstream asset of that project reads a Krishiv table with (``IcebergCatalogResource``, ``committed_table``)."""

from typing import Any

from krishiv_assets.component import KrishivComponent

__all__ = ["IcebergCatalogResource", "KrishivComponent", "committed_table"]


def __getattr__(name: str) -> Any:
    # Loaded when asked for: `dg list components` imports this package, and needs neither pyiceberg nor the assets.
    if name == "IcebergCatalogResource":
        from krishiv_assets.resources import IcebergCatalogResource

        return IcebergCatalogResource
    if name == "committed_table":
        from krishiv_assets.downstream import committed_table

        return committed_table
    raise AttributeError(f"module 'krishiv_assets' has no attribute {name!r}")
