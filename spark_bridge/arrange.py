"""How an ingest arranges a DataFrame for its senders: each key's rows together in one partition,
in order. Spark plans only (through PySpark and its JVM plan objects); nothing here sends."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from actors.errors import IngestError

KEY_COLUMN = "__raybroker_key"  # the partition id, as the key, when the ingest has none
ORDER_COLUMN = "__raybroker_order"  # the input's own order, when the ingest names no order
NULL_KEY = "raybroker-ingest: null key"  # what the arrangement raises in Spark on a null key


@dataclass(frozen=True)
class Arrangement:
    """An input arranged for an ingest's senders: `frame`, each partition one sender's rows;
    `shuffled`: whether Spark moves the rows to arrange them; `partitions`: how many partitions
    `frame` has (None: as many as the input has, up to the ingest's; ask Spark)."""

    frame: Any
    shuffled: bool
    partitions: int | None


def arrangement(
    df: Any,
    key: str | None,
    order: str | None,
    partitions: int | None,
    *,
    shuffle: bool = False,
    columns: Sequence[str] | None = None,
) -> Arrangement:
    """`df` with each key's rows together in one partition, in order: hash-partitioned by key and
    sorted by key and order (a sender then meets its keys in the order of their dialog ids,
    `plan.dialog_id`), in `partitions` partitions (default: one per executor core). Without
    a key, each input partition is a key and keeps its order. The reconciliation derives rows'
    positions the same way.

    A null key fails the shuffle's map side, which ends before any partition reaches a sender:
    the check costs no pass of its own and nothing is sent (Spark drops it for a key column it
    knows holds no nulls). A cached input already hash-partitioned by the key alone keeps its
    partitions instead, with no shuffle (`_in_place`), unless `shuffle` says otherwise.

    `columns`: what the senders read besides the key (None: every column). Only those and the
    key are arranged and streamed to them: Spark prunes the rest before the shuffle, so the
    other columns of a wide input cost nothing."""
    from pyspark.sql import functions as F

    wanted = partitions or df.sparkSession.sparkContext.defaultParallelism
    if key is None:
        # each partition is a sender task, which costs tens of milliseconds to start: more than
        # wanted are merged whole, one after another (a key's rows stay together, in order)
        keyed = df.withColumn(KEY_COLUMN, F.spark_partition_id()).coalesce(wanted)
        return Arrangement(_kept(keyed, KEY_COLUMN, columns), False, None)
    original = df
    if order is None:
        df = df.withColumn(ORDER_COLUMN, F.monotonically_increasing_id())
        order = ORDER_COLUMN
    placed = None if shuffle else _in_place(original, df, key, wanted)
    if placed is not None:
        return Arrangement(_kept(placed.sortWithinPartitions(key, order), key, columns), False,
                           wanted)  # fmt: skip
    keyed = F.when(F.col(key).isNull(), F.raise_error(F.lit(NULL_KEY))).otherwise(F.col(key))
    arranged = df.repartition(wanted, keyed).sortWithinPartitions(key, order)
    return Arrangement(_kept(arranged, key, columns), True, wanted)


def _kept(df: Any, key: str, columns: Sequence[str] | None) -> Any:
    """`df` with only the key and `columns` (all of them for None)."""
    return df if columns is None else df.select(*dict.fromkeys([key, *columns]))


def _in_place(original: Any, df: Any, key: str, wanted: int) -> Any:
    """`df` partitioned by `key` as it already is, or None (the ingest shuffles).

    Only for a cached input hash-partitioned by the key alone: what a cache holds is placed once
    and for all. (An uncached input's partitioning can change as it runs: adaptive execution may
    split a skewed join's partition, putting one key's rows in two partitions, whose senders
    would then each send the key's first rows as its first: some rows never sent. It may do so
    only where nothing above needs the partitioning, which an ingest's sort does not.) Spark
    drops the repartition when the cache holds the rows so, and then the plan reads the cache
    alone, with no shuffle (`reads_only_cache`; a DataFrame's own flag says it was cached, not
    that its cache is still there). A null key is ruled out first, with no shuffle to find it
    in, by a count the cache's column statistics answer without reading the rows (which also
    fills the cache if it is not yet: until then Spark plans it as partitioned unknown ways,
    and keeps the repartition). More partitions than the ingest wants are merged whole
    (`coalesce`: no rows move between executors, and a key's rows stay together): each
    partition is a sender task, which costs tens of milliseconds to start."""
    from pyspark.sql import functions as F

    if not original.is_cached:
        return None
    n = _hash_partitions(original, key)
    if n is None or wanted > n:
        return None
    merged = original.coalesce(wanted)  # a task per partition would cost more than reading
    if original.schema[key].nullable:
        nulls = merged.where(F.col(key).isNull()).count()
        if nulls:
            raise IngestError(null_keys(nulls, key))
    else:
        merged.count()  # fills the cache
    placed = df.repartition(n, F.col(key))
    if wanted < n:
        placed = placed.coalesce(wanted)
    return placed if reads_only_cache(placed) else None


def reads_only_cache(df: Any) -> bool:
    """Whether Spark's plan for `df` reads nothing but cached data and moves no rows between
    partitions: no shuffle, and every source a cache's scan."""
    for node in _nodes(df):
        name = node.getClass().getSimpleName()
        if name in _SHUFFLES:
            return False
        if node.children().size() == 0 and name not in _CACHE_SCANS:
            return False
    return True


def _physical(df: Any) -> Any:
    """The physical plan Spark will run for `df` (under adaptive execution, the plan as it stands:
    its first form, once Spark has dropped the shuffles the input's partitioning makes needless,
    or the final one of a plan that ran)."""
    return _unwrapped(df._jdf.queryExecution().executedPlan())


def _unwrapped(plan: Any) -> Any:
    """Adaptive execution's plan as it stands, for its wrapper; any other plan as it is."""
    if plan.getClass().getSimpleName() == "AdaptiveSparkPlanExec":
        return plan.executedPlan()
    return plan


def _hash_partitions(df: Any, key: str) -> int | None:
    """How many partitions `df` is hash-partitioned into by the column `key` alone, if it is;
    for a cached input, the partitioning of the plan its cache holds. (A hint, to spare the
    null count when it cannot help: `reads_only_cache` decides.)"""
    plan = _physical(df)
    partitioning = plan.outputPartitioning()
    if plan.getClass().getSimpleName() == "InMemoryTableScanExec":
        partitioning = _unwrapped(plan.relation().cachedPlan()).outputPartitioning()
    if partitioning.getClass().getSimpleName() != "HashPartitioning":
        return None
    by = partitioning.expressions()
    column = by.apply(0) if by.size() == 1 else None
    if column is None or column.getClass().getSimpleName() != "AttributeReference":
        return None
    return int(partitioning.numPartitions()) if column.name() == key else None


def shuffles(df: Any) -> int:
    """The shuffles in `df`'s plan (a cached input's own, already run, are not counted)."""
    return sum(node.getClass().getSimpleName() in _SHUFFLES for node in _nodes(df))


_SHUFFLES = ("ShuffleExchangeExec", "ShuffleQueryStageExec")  # to run, or run
_CACHE_SCANS = ("InMemoryTableScanExec", "TableCacheQueryStageExec")  # (the latter: once run)


def _nodes(df: Any) -> Iterator[Any]:
    """The nodes of `df`'s physical plan (through adaptive execution's wrappers; a cache scan's
    own plan, already run, is not among them)."""
    todo = [_physical(df)]
    while todo:
        node = _unwrapped(todo.pop())
        yield node
        children = node.children()
        todo += [children.apply(i) for i in range(children.size())]


def null_keys(nulls: int, key: str) -> str:
    """What an ingest says when `nulls` rows have no key."""
    return (
        f"{nulls:,} rows have a null key in column {key!r}; every row needs a key (fill or drop "
        "them first)"
    )
