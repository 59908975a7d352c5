"""The core every layer builds on: the pipeline spec, table schemas, errors, fault points and the catalog."""
