"""Dagster definitions for Krishiv (assets, sensors, checks); built from the pipeline spec in the next step."""
