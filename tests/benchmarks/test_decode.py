"""The decode benchmark: every format decoded (and checked against the orders it encoded), figures written."""

from __future__ import annotations

import json

from benchmarks import decode


def test_a_tiny_decode_run_writes_every_formats_figures(tmp_path) -> None:
    out = tmp_path / "decode.json"
    assert decode.main(["--records", "300", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    formats = {"json", "json_nested", "json_flat_same_values", "avro", "json_schema", "protobuf", "debezium_json"}
    assert set(doc["records_per_s_one_core"]) == formats
    assert all(v > 0 for v in doc["records_per_s_one_core"].values())
    assert doc["relative_to_json"]["json"] == 1.0
    assert doc["nested_relative_to_flat_same_values"] > 0
    assert doc["date"].endswith("+00:00") and len(doc["load_average"]) == 3 and len(doc["commit"]) == 40


def test_a_subset_of_cases_is_timed_alone_with_its_ratios(tmp_path) -> None:
    out = tmp_path / "decode-nested.json"
    assert decode.main(["--records", "200", "--cases", "json_nested,json_flat_same_values", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert list(doc["records_per_s_one_core"]) == ["json_nested", "json_flat_same_values"]
    assert "relative_to_json" not in doc and doc["nested_relative_to_flat_same_values"] > 0
