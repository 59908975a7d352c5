"""The interpreter Spark starts its Python workers with: this environment's Python, importing PySpark as installed.

Spark starts every Python worker as ``<python> -m <module>`` with ``$SPARK_HOME/python/lib/pyspark.zip`` first on
``PYTHONPATH``. Python compiles each module it imports from a zip at every start (a zip holds sources only), where
the installed PySpark beside it is byte-compiled: the streaming source's runner took 0.7 s of CPU to import from the
zip and 0.3 s as installed. That runner must connect back to the JVM within Spark's fixed 10 s, and a query whose
runner misses it fails; on a loaded machine the difference decides it. The zip and the installed package are the
same PySpark (the one the driver runs), so the worker drops the zip from its path and runs the module as ``-m``
would. Any other invocation is handed to the interpreter unchanged.
"""

from __future__ import annotations

import os
import runpy
import sys

PYSPARK_ZIP = os.path.join("python", "lib", "pyspark.zip")


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])
    # As ``-m`` would: the working directory first (a script's path has its own folder there), no zip.
    sys.path[:] = [os.getcwd(), *(entry for entry in sys.path[1:] if not entry.endswith(PYSPARK_ZIP))]
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
