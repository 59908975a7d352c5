"""The ``krishiv`` command's inspection subcommands on a real pipeline run, and its error reporting."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from krishiv.catalog import load_catalog, qualified
from krishiv.cli import main
from krishiv.operations import run_pipelines
from tests.spark_jobs.pipeline_helpers import produce_orders


def test_status_lineage_and_verify_catch_a_duplicate_window(make_spec, spec_file, broker, spark, capsys):
    spec = make_spec(max_records=1_000)
    produce_orders(spec, 3_000, late=5, malformed=4)
    run_pipelines(spec, list(spec.pipelines), once=True)

    assert main(["--spec", str(spec_file), "status"]) == 0
    out = capsys.readouterr().out
    assert "pending" in out and "4 rejected" in out

    assert main(["--spec", str(spec_file), "commit"]) == 0
    assert main(["--spec", str(spec_file), "lineage"]) == 0
    assert main(["--spec", str(spec_file), "verify"]) == 0
    assert "VIOLATIONS" not in capsys.readouterr().out

    # A second writer appends a window that is already there: verify must say which one and fail.
    table = load_catalog(spec).load_table(qualified(spec, spec.pipeline().table))
    first = table.scan().to_arrow().slice(0, 1)
    table.append(first.cast(pa.schema([f.with_nullable(f.nullable) for f in first.schema])))
    assert main(["--spec", str(spec_file), "verify"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATIONS" in out and "appears more than once" in out
    assert str(first.column("window_start")[0].as_py().date()) in out


def test_bad_config_is_reported_with_the_field(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "krishiv.toml"
    spec.write_text(
        '[[pipelines]]\nname = "p"\ntopic = "t"\nevent_time_field = "t"\nwatermark_delay = "5 parsecs"\n'
        '[pipelines.fields]\nt = "timestamp_ms"\n[[pipelines.aggregations]]\nname = "n"\nfunction = "count"\n'
    )
    assert main(["--spec", str(spec), "status"]) == 2
    assert "pipelines[0].watermark_delay" in capsys.readouterr().err
