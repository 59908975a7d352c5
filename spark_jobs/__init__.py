"""The Spark side of Krishiv: the Kafka data source, the windowed aggregation job and its staging sink."""
