"""``python -m benchmarks.profile``'s reading of py-spy's collapsed stacks and of Spark's query progress.

The profile itself (a 1M-event run under py-spy) is run by hand; these pin how its summary attributes samples to
processes and phases, on stacks shaped as py-spy 0.4 writes them with ``--subprocesses``.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.profile import phase_seconds, summarize_stacks

DRIVER = 'process 100:".venv/bin/python -m benchmarks.profile --note a; b"'
JVM = 'process 200:"/usr/lib/jvm/bin/java -cp x org.apache.spark.deploy.SparkSubmit"'
DAEMON = 'process 300:"/venv/bin/python -m pyspark.daemon pyspark.worker"'
WORKER = 'process 301:"/venv/bin/python -m pyspark.daemon pyspark.worker"'
RUNNER = 'process 400:"/venv/bin/python -m pyspark.sql.streaming.python_streaming_source_runner"'


def test_samples_go_to_the_innermost_process_and_waiting_is_left_out(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stacks.write_text(
        "\n".join(
            [
                f"{DRIVER};main (benchmarks/profile.py:10);Ledger._connect (outbox/ledger.py:544) 150",
                f"{DRIVER};{JVM};{DAEMON};{WORKER};<module> (daemon.py:292);manager (daemon.py:200);"
                "worker (daemon.py:90);read_range (spark_jobs/kafka_source.py:300) 250",
                f"{DRIVER};{JVM};{DAEMON};{WORKER};<module> (daemon.py:292);manager (daemon.py:200) 900",
                f"{DRIVER};{JVM};{DAEMON};<module> (daemon.py:292);manager (daemon.py:150) 40",
                f"{DRIVER};{JVM};{RUNNER};_run_module_as_main (<frozen runpy>:198);"
                "_compile_source (<frozen zipimport>:1) 50",
            ]
        )
        + "\n"
    )
    lines = summarize_stacks(stacks, rate=100, top=5)
    text = "\n".join(lines)
    assert "python worker                                    2.50 s   (+9.00 s waiting)" in text
    assert "driver python                                    1.50 s" in text
    assert "source runner                                    0.50 s" in text
    assert "daemon (pyspark.worker)" in text and "(+0.40 s waiting)" in text
    assert "2.50 s  read_range (spark_jobs/kafka_source.py)" in text
    assert "1.50 s  Ledger._connect (outbox/ledger.py)" in text


def test_phases_are_summed_over_batches() -> None:
    progress = [
        {"durationMs": {"addBatch": 1500, "latestOffset": 20, "triggerExecution": 1600}},
        {"durationMs": {"addBatch": 500, "walCommit": 30, "triggerExecution": 560}},
    ]
    assert phase_seconds(progress) == {
        "addBatch": 2.0,
        "latestOffset": 0.02,
        "triggerExecution": 2.16,
        "walCommit": 0.03,
    }
