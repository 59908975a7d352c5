"""The commands of ``krishiv``, a module per group: ``first_hour`` (broker, init, topic, produce), ``pipeline`` (run,
commit, demo), ``inspection`` (status, lineage, verify, check), ``maintenance`` (compact, expire-snapshots,
remove-orphans, maintain, clean-staging, ledger-compact,
ledger-copy) and ``recovery`` (skip-offsets, restage); ``parser`` reads
the command line and ``common`` holds what they share. The process entry, ``main``, is ``krishiv.cli``."""
