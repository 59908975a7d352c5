"""Rows that waited for their transactions, kept before the spec changed, in the layout of the query now."""

from __future__ import annotations

import pyarrow as pa

from spark_jobs.topics_shape import conform


def test_rows_kept_before_a_topic_or_a_field_was_added_take_the_new_layout() -> None:
    kept = pa.table(
        {
            "offset": pa.array([7, 8], pa.int64()),
            "__t0": pa.array([{"id": 1, "gone": "x"}, None], pa.struct([("id", pa.int32()), ("gone", pa.string())])),
        }
    )
    now = pa.schema(
        [
            ("offset", pa.int64()),
            ("__t0", pa.struct([("id", pa.int64()), ("note", pa.string())])),  # widened, one added, one removed
            ("__t1", pa.struct([("id", pa.int32())])),  # a topic added
        ]
    )
    rows = conform(kept, now)
    assert rows.schema == now
    assert rows.to_pylist() == [
        {"offset": 7, "__t0": {"id": 1, "note": None}, "__t1": None},
        {"offset": 8, "__t0": None, "__t1": None},
    ]
