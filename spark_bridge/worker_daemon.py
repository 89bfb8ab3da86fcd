"""The executors' Python daemon: PySpark's own (`pyspark.daemon`), started with the Spark jar
that Spark puts on every Python worker's path taken off it.

Spark adds its spark-core jar to the Python workers' PYTHONPATH, for builds that ship PySpark
inside it (a pip-installed PySpark has no Python file there). A jar on `sys.path` gets a
zipimporter, and PySpark's worker calls `importlib.invalidate_caches()` at the start of every
task, which has that importer read the jar's directory again: 35-55 ms of CPU a task for the
14 MB jar. The workers fork from this daemon, so taking it off here spares every task. Python
runs `spark_bridge/__init__.py` before this module, so the workers also fork with the bridge
imported: a new worker's first ingest does not import it (about 0.6 s of CPU) again.

Sessions from `spark_bridge.session` start it (`spark.python.daemon.module`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def without_jars(paths: Sequence[str]) -> list[str]:
    """`paths` without the jar files among them."""
    return [p for p in paths if not (p.endswith(".jar") and os.path.isfile(p))]


def main() -> None:
    kept = without_jars(sys.path)
    gone = tuple(set(sys.path) - set(kept))
    sys.path[:] = kept
    # and the importers of directories inside them (a namespace package such as `google`
    # finds one in the jar's `google/`), which are read again as well
    for path in [p for p in sys.path_importer_cache if p.startswith(gone)]:
        del sys.path_importer_cache[path]
    from pyspark import daemon

    daemon.manager()  # writes its port to stdout, which Spark reads: nothing else may print


if __name__ == "__main__":
    main()
