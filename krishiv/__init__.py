"""Krishiv: exactly-once streaming ingestion from Kafka through Spark into Apache Iceberg."""
