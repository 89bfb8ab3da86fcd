"""The Spark bridge on a real Spark-on-Ray session (RayDP) with real brokers: ingest from Spark's
executors, exactly once under re-runs and a killed sender, the audit as a DataFrame, and the
reconciliation that proves nothing was lost, doubled or reordered."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pyarrow as pa
import pytest
from pyspark import TaskContext
from pyspark.sql import functions as F

from actors import Begin, Broker, End, IngestError
from actors.errors import UnknownMessageType
from actors.model.catalog import MessageType
from spark_bridge import AuditCursor, audit_frame, ingest, reconcile
from spark_bridge.arrange import arrangement, shuffles
from spark_bridge.plan import DIGEST_IDS, RANKED_IDS, IngestSpec, PartitionPlanner, dialog_id
from spark_bridge.reconcile import expected_rows
from tests.polling import wait_until

from .conftest import define_orders, in_own_process

pytestmark = pytest.mark.slow

SEND = {"from_service": "Orders", "to_service": "Fulfilment", "contract": "OrderContract"}
# the columns of `orders_frame` an ingest reads: one dialog per customer, its rows by ts
ORDER_COLUMNS = {"message_type": "Order", "body": "order", "key": "customer", "order": "ts"}
BY_CUSTOMER = {"message_type": "Order", "body": "order", "key": "customer"}  # the input's order


def orders_frame(spark, rows: int, keys: int):
    """`rows` orders over `keys` customers; `ts` orders each customer's rows (shuffled against
    the input's own order), `order` is the JSON body."""
    return (
        spark.range(rows)
        .select(
            (F.col("id") % keys).cast("string").alias("customer"),
            ((F.col("id") * 7919) % rows).alias("ts"),
            F.struct(F.col("id").alias("id"), (F.col("id") % keys).alias("customer")).alias(
                "order"
            ),
        )
        .cache()
    )


def drain(broker, queue="FulfilmentQueue"):
    """Every message waiting on `queue`, received and committed, as decoded bodies."""
    out = []
    while got := broker.receive(queue, max_groups=100, top=100_000):
        out += [json.loads(m.body) for g in got for m in g.messages]
        broker.commit(got)
    return out


@pytest.fixture
def orders_broker(make_broker):
    b = make_broker()
    define_orders(b)
    return b


@pytest.fixture(scope="module")
def refusing_broker(make_module_broker) -> Broker:
    """One orders broker for the module's ingests that must be refused before anything is
    sent: each of those tests ends by checking that it is still empty."""
    b = make_module_broker()
    define_orders(b)
    return b


def assert_nothing_sent(b: Broker) -> None:
    assert b.queue("FulfilmentQueue") == [] and b.endpoints() == []
    assert b.transmission_queue() == []


def test_the_session_cuts_shuffles_into_two_partitions_per_executor_core(spark):
    # one executor of 2 cores (spark_session's defaults); Spark's own default is 200
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"


def _worker_paths(batches):
    import sys

    import pyarrow as pa

    for _ in batches:
        pass
    paths = [*sys.path, *sys.path_importer_cache]
    yield pa.RecordBatch.from_pylist([{"jars": [p for p in paths if ".jar" in p]}])


def test_python_workers_run_without_the_spark_jar_on_their_path(spark):
    # Spark puts its spark-core jar on the workers' PYTHONPATH; each task then read its
    # directory again (importlib.invalidate_caches): the session's daemon takes it off
    rows = spark.range(4).repartition(2).mapInArrow(_worker_paths, "jars array<string>").collect()
    assert len(rows) == 2 and all(r.jars == [] for r in rows), rows


def test_a_short_jobs_session_keeps_the_module_openings_beside_its_jit_and_gc_options(spark):
    # the session fixture's settings (short_jobs_configs), as every JVM of the session got them
    for jvm in ("driver", "executor", "ray.raydp_app_master"):
        options = spark.conf.get(f"spark.{jvm}.extraJavaOptions").split()
        assert "--add-opens=java.base/java.nio=ALL-UNNAMED" in options, jvm
        assert {"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"} <= set(options), jvm


def test_the_drivers_jvm_logs_to_the_connected_ray_nodes_directory(spark):
    # not to /tmp/ray/session_latest/logs, RayDP's agent's default: another cluster's, or a
    # link to a session gone, where the driver's JVM did not start ("Error create log dir")
    import ray

    jvm_logs = spark.sparkContext._jvm.java.lang.System.getProperty("ray.logging.dir")
    assert jvm_logs == ray._private.worker._global_node.get_logs_dir_path()
    assert os.path.isdir(jvm_logs)


def test_a_keyed_ingest_delivers_every_row_once_in_order_per_key(spark, orders_broker):
    df = orders_frame(spark, 3000, 40)

    report = ingest(
        df,
        orders_broker,
        **SEND,
        **ORDER_COLUMNS,
        progress=False,
    )

    assert (report.rows, report.sent, report.dialogs, report.rejected) == (3000, 3000, 40, [])
    assert report.rows_per_s > 0 and report.shuffled  # its rows were not arranged by customer
    got = drain(orders_broker)
    assert sorted(o["id"] for o in got) == list(range(3000))
    ts = {r["order"]["id"]: r["ts"] for r in df.collect()}
    by_customer: dict[int, list[int]] = {}
    for o in got:
        by_customer.setdefault(o["customer"], []).append(ts[o["id"]])
    assert len(by_customer) == 40
    assert all(seen == sorted(seen) for seen in by_customer.values())


def partitions_of_keys(frame, key: str) -> dict[str, set[int]]:
    """Which partitions of `frame` hold each key's rows, as Spark runs it (read from the rows,
    not from the plan)."""

    def seen(batches):
        pid = TaskContext.get().partitionId()
        keys = {str(k) for b in batches for k in b.column(key).to_pylist()}
        yield pa.RecordBatch.from_pylist([{"key": k, "p": pid} for k in keys], schema=SEEN)

    out: dict[str, set[int]] = {}
    for row in frame.mapInArrow(seen, "key string, p int").collect():
        out.setdefault(row.key, set()).add(row.p)
    return out


SEEN = pa.schema([("key", pa.string()), ("p", pa.int32())])
MET = pa.schema([("p", pa.int32()), ("keys", pa.string())])


def test_an_input_already_partitioned_by_the_key_is_sent_without_a_shuffle(spark, orders_broker):
    # cached hash-partitioned by customer into 8 (a nullable column: the cache's statistics rule
    # out a null key), sent in its own order: its partitions are merged whole into one per core
    df = orders_frame(spark, 3000, 40).repartition(8, "customer").cache()
    cores = spark.sparkContext.defaultParallelism
    arranged = arrangement(df, "customer", None, None)
    assert not arranged.shuffled and shuffles(arranged.frame) == 0
    assert arranged.frame.rdd.getNumPartitions() == arranged.partitions == cores < 8
    assert all(len(p) == 1 for p in partitions_of_keys(arranged.frame, "customer").values())

    report = ingest(df, orders_broker, **SEND, **BY_CUSTOMER, progress=False)

    assert (report.rows, report.sent, report.dialogs, report.shuffled) == (3000, 3000, 40, False)
    assert len(drain(orders_broker)) == 3000
    audit = audit_frame(spark, [orders_broker])
    result = reconcile(audit, df, ingest_id=report.ingest_id, key="customer")
    assert result.ok and result.delivered == 3000  # every row once, each key in the input's order


def test_only_the_key_and_the_columns_the_senders_read_are_shuffled_and_streamed(
    spark, orders_broker, capsys
):
    """A wide input's other columns are pruned before the shuffle: they cost an ingest nothing."""
    df = orders_frame(spark, 600, 12).withColumn("wide", F.repeat(F.lit("w"), 2000))
    frame = arrangement(df, "customer", "ts", None, columns=["order"]).frame
    assert frame.columns == ["customer", "order"]
    frame.explain(mode="formatted")
    plan = capsys.readouterr().out
    exchange = plan[plan.index("Exchange") :]
    exchange = exchange[: exchange.index("Arguments")]  # the rows the shuffle moves
    assert "customer" in exchange and "wide" not in exchange

    report = ingest(df, orders_broker, **SEND, **ORDER_COLUMNS, progress=False)

    assert (report.rows, report.sent, report.dialogs) == (600, 600, 12)
    assert sorted(o["id"] for o in drain(orders_broker)) == list(range(600))
    result = reconcile(audit_frame(spark, orders_broker), df, ingest_id=report.ingest_id,
                       key="customer", order="ts")  # fmt: skip
    assert result.ok and result.delivered == 600


def test_a_partitioned_input_is_shuffled_when_its_partitioning_does_not_place_the_keys(spark):
    base = orders_frame(spark, 100, 5)
    by_customer = base.repartition(3, "customer").cache()
    other_column = base.repartition(3, "ts").cache()
    not_cached = base.repartition(3, "customer").select("customer", "ts", "order")
    # cached, but its cache gone since (a twin of the same plan unpersisted shares its entry):
    # the flag still says cached, the plan reads the rows afresh
    gone = base.repartition(4, "customer").cache()
    gone.count()
    base.repartition(4, "customer").cache().unpersist()
    assert gone.is_cached

    def shuffled(df, partitions):
        arranged = arrangement(df, "customer", "ts", partitions)
        # what the report says is what Spark does, and each key is in one partition either way
        assert arranged.shuffled == (shuffles(arranged.frame) > 0)
        assert all(len(p) == 1 for p in partitions_of_keys(arranged.frame, "customer").values())
        return arranged.shuffled

    assert not shuffled(by_customer, 2)  # merged: no rows move
    assert shuffled(by_customer, 5)  # more partitions than it has
    assert shuffled(other_column, None)
    assert shuffled(not_cached, None)  # not cached: whatever its plan says
    assert shuffled(gone, None)


def test_a_null_key_in_an_input_partitioned_by_the_key_is_refused_before_anything_is_sent(
    spark, refusing_broker
):
    nulls = (
        spark.range(0, 2_000, numPartitions=4)
        .select(
            F.when(F.col("id").isin(7, 1_234), None).otherwise(F.col("id") % 50).alias("customer"),
            F.to_json(F.struct("id")).alias("order"),
        )
        .repartition(4, "customer")
        .cache()
    )

    with pytest.raises(IngestError, match="2 rows have a null key"):
        arrangement(nulls, "customer", None, None)  # found planning: the rows are not shuffled
    with pytest.raises(IngestError, match="2 rows have a null key in column 'customer'"):
        ingest(nulls, refusing_broker, **SEND, **BY_CUSTOMER, progress=False)

    assert_nothing_sent(refusing_broker)


def test_reconciliation_is_clean_then_reports_an_injected_drop_and_double(spark, orders_broker):
    df = orders_frame(spark, 1000, 10)
    report = ingest(
        df,
        orders_broker,
        **SEND,
        **ORDER_COLUMNS,
        progress=False,
    )
    drain(orders_broker)
    audit = audit_frame(spark, orders_broker)
    args = {"ingest_id": report.ingest_id, "key": "customer", "order": "ts"}

    clean = reconcile(audit, df, **args)

    assert (clean.expected, clean.delivered) == (1000, 1000)
    assert (clean.missing, clean.doubled, clean.out_of_order, clean.unexpected) == (0, 0, 0, 0)
    assert clean.ok

    records = audit.df
    victim = records.orderBy("conversation_id", "sequence_number").limit(1).collect()[0]
    dropped = records.filter(
        (F.col("conversation_id") != victim["conversation_id"])
        | (F.col("sequence_number") != victim["sequence_number"])
    )
    twice = records.union(records.filter(F.col("message_id") == victim["message_id"]))

    lost = reconcile(dropped, df, **args)
    doubled = reconcile(twice, df, **args)

    # the key whose dialog the victim was on (dialog ids are derived from ingest id and key)
    (victim_key,) = [
        k
        for k in map(str, range(10))
        if dialog_id(report.ingest_id, k) == victim["conversation_id"]
    ]
    assert (lost.missing, lost.doubled, lost.missing_keys, lost.ok) == (1, 0, [victim_key], False)
    assert (doubled.missing, doubled.doubled, doubled.doubled_keys) == (0, 1, [victim_key])


def test_an_ingest_run_again_with_its_id_sends_nothing_twice(spark, orders_broker, tmp_path):
    df = orders_frame(spark, 2000, 25)
    first = ingest(
        df,
        orders_broker,
        **SEND,
        **ORDER_COLUMNS,
        ingest_id="rerun-1",
        progress=False,
    )

    again = ingest(
        df,
        orders_broker,
        **SEND,
        **ORDER_COLUMNS,
        ingest_id="rerun-1",
        batch_rows=333,
        progress=False,
    )

    assert (first.sent, again.sent, again.rows) == (2000, 0, 2000)
    assert sorted(o["id"] for o in drain(orders_broker)) == list(range(2000))
    result = reconcile(
        audit_frame(spark, orders_broker), df, ingest_id="rerun-1", key="customer", order="ts"
    )
    assert result.ok and result.delivered == 2000


def test_a_paced_ingest_keeps_to_its_rate_and_sends_every_row_once(spark, orders_broker):
    """600 rows at 400 rows a second over 2 partitions (200 each) in calls of 20 (a tenth of a
    second's rows, the paced default): the larger partition holds 300 rows or more, so its last
    call cannot go before 280 / 200 = 1.4 s, nor can the ingest end sooner; every row arrives
    once, in order."""
    df = orders_frame(spark, 600, 12)
    report = ingest(
        df, orders_broker, **SEND, **ORDER_COLUMNS, ingest_id="paced-1", rows_per_s=400,
        partitions=2, progress=False,
    )  # fmt: skip

    assert (report.sent, report.rows) == (600, 600)
    assert report.calls >= 600 // 20
    assert report.elapsed_s >= 1.4
    assert sorted(o["id"] for o in drain(orders_broker)) == list(range(600))
    result = reconcile(
        audit_frame(spark, orders_broker), df, ingest_id="paced-1", key="customer", order="ts"
    )
    assert result.ok and result.delivered == 600


def _end_every_dialog(broker, queue: str) -> int:
    """Receive what waits on `queue` and end each conversation it came on, in the commit."""
    ended = 0
    while got := broker.receive(queue, max_groups=100, top=100_000):
        handles = {m.conversation_handle for g in got for m in g.messages}
        broker.commit(got, ops=[End(h) for h in handles])
        ended += len(handles)
    return ended


def test_an_ingest_run_again_after_its_dialogs_ended_and_went_sends_nothing_twice(
    spark, make_broker
):
    """The target ends every dialog, the initiator ends its side on the EndDialog, and both
    ends are purged (closed_retention_s=0): a re-run of the ingest with its id begins nothing
    again and sends nothing; the audit still reconciles every row once."""
    b = make_broker(limits={"closed_retention_s": 0})
    define_orders(b)
    df = orders_frame(spark, 600, 6)
    first = ingest(df, b, **SEND, **ORDER_COLUMNS, ingest_id="purged-1", progress=False)
    assert _end_every_dialog(b, "FulfilmentQueue") == 6
    ended = []  # the initiator ends each dialog on its EndDialog, as they come
    wait_until(lambda: ended.append(_end_every_dialog(b, "OrdersQueue")) or sum(ended) == 6, 30,
               "the six EndDialogs")  # fmt: skip
    wait_until(lambda: b.endpoints() == [], 30, "both ends of every dialog purged")

    again = ingest(df, b, **SEND, **ORDER_COLUMNS, ingest_id="purged-1", progress=False)

    assert (first.sent, again.sent, again.rows) == (600, 0, 600)
    assert b.endpoints() == [] and b.queues()["FulfilmentQueue"]["depth"] == 0
    result = reconcile(audit_frame(spark, b), df, ingest_id="purged-1", key="customer", order="ts")
    assert result.ok and result.delivered == 600


def test_each_partition_meets_its_keys_in_the_order_of_their_dialog_ids(spark):
    """Spark's order of whole-number and text keys is the order of their dialog ids
    (`plan.dialog_id`): a sender begins its dialogs in id order, so the brokers' indexes grow
    at an end."""
    digits = orders_frame(spark, 3000, 300)
    numbers = digits.withColumn("customer", F.col("customer").cast("long") - 150)
    texts = digits.withColumn("customer", F.concat(F.lit("customer-"), F.col("customer")))

    def keys_in_order(batches):
        pid, keys = TaskContext.get().partitionId(), []
        for b in batches:
            for k in b.column("customer").to_pylist():
                if not keys or keys[-1] != str(k):
                    keys.append(str(k))
        yield pa.RecordBatch.from_pylist([{"p": pid, "keys": json.dumps(keys)}], schema=MET)

    for df, expected in (
        (numbers, range(-150, 150)),
        (texts, (f"customer-{i}" for i in range(300))),
    ):
        frame = arrangement(df, "customer", "ts", None).frame
        parts = frame.mapInArrow(keys_in_order, "p int, keys string").collect()
        met = [json.loads(r["keys"]) for r in parts]
        assert sorted(k for keys in met for k in keys) == sorted(map(str, expected))
        for keys in met:
            ids = [dialog_id("i", k) for k in keys]
            assert ids == sorted(ids)


@pytest.mark.parametrize("kind", [None, RANKED_IDS, DIGEST_IDS])
def test_spark_names_each_keys_dialog_as_the_planner_does(spark, kind):
    """`reconcile` finds an ingest's rows by their dialog ids computed in Spark SQL: for every
    kind of id and keys at the edges of whole numbers and text, the planner's."""
    keys = ["0", "7", "-7", "-0", "007", "+5", " 5", "5 ", "1e3", "4.0", "٥", "0x1f", "",
            str(2**63 - 1), str(-(2**63)), str(2**63), str(-(2**63) - 1), "9" * 40, "kéy",
            "customer-000000123456", "a", "a\x00", "日本語のキー" * 5]  # fmt: skip
    df = spark.createDataFrame([(k, 0) for k in keys], "customer string, ts long")
    args = {} if kind is None else {"ids": kind}

    got = expected_rows(df, "ing1", "customer", "ts", **args).collect()

    by_key = {r["key"]: r["conversation_id"] for r in got}
    assert by_key == {k: dialog_id("ing1", k, *([] if kind is None else [kind])) for k in keys}
    numbers = spark.createDataFrame(
        [(int(k), 0) for k in keys[:3] + keys[13:15]], "n long, ts long"
    )
    got = expected_rows(numbers, "ing1", "n", "ts", **args).collect()
    assert {r["key"]: r["conversation_id"] for r in got} == {
        k: by_key[k] for k in keys[:3] + keys[13:15]
    }


@pytest.mark.parametrize("kind", [DIGEST_IDS, RANKED_IDS])
def test_an_ingest_begun_by_an_earlier_release_is_finished_without_sending_a_row_twice(
    spark, orders_broker, kind
):
    """Earlier releases named an ingest's dialogs by the key's digest alone (`DIGEST_IDS`), or
    its CRC-32 and digest (`RANKED_IDS`). A run of theirs, interrupted after half the keys, is
    run again by this one with the same id: it finds those dialogs, sends only the rows they
    lack, and the reconciliation reads the kind of ids from the audit."""
    df = orders_frame(spark, 1200, 12)
    rows = df.select("customer", "ts", F.to_json("order").alias("order")).toPandas()
    table = pa.Table.from_pandas(rows.sort_values(["customer", "ts"]), preserve_index=False)
    spec = IngestSpec(ingest_id="old-1", run="r1", **SEND, message_type=MessageType("Order"),
                      body="order", key="customer", batch_rows=50, ids=kind)  # fmt: skip
    planner, half = PartitionPlanner(spec), {str(i) for i in range(6)}
    for batch in table.to_batches(max_chunksize=100):
        for call in planner.calls(batch):
            keys = {op.handle for op in call.ops if isinstance(op, Begin)}
            if keys <= {dialog_id("old-1", k, kind) for k in half}:
                orders_broker.apply(call.ops, request_id=call.request_id)
    assert orders_broker.queues()["FulfilmentQueue"]["depth"] == 600
    # a dialog of the caller's own, named under the ingest's prefix, sorting before its dialogs
    mine = Begin("Orders", "Fulfilment", "OrderContract", handle="old-1/0-mine", if_absent=True)
    orders_broker.apply([mine])

    again = ingest(df, orders_broker, **SEND, **ORDER_COLUMNS, ingest_id="old-1", progress=False)

    assert (again.rows, again.sent, again.dialogs) == (1200, 600, 12)
    handles = {r["conversation_handle"] for r in orders_broker.rerunnable()} - {mine.handle}
    assert handles == {dialog_id("old-1", str(i), kind) for i in range(12)}
    assert sorted(o["id"] for o in drain(orders_broker)) == list(range(1200))
    result = reconcile(audit_frame(spark, orders_broker), df, ingest_id="old-1", key="customer",
                       order="ts")  # fmt: skip
    assert result.ok and result.delivered == 1200


def test_a_sender_killed_mid_ingest_and_the_rerun_deliver_exactly_once(spark, orders_broker):
    df = orders_frame(spark, 100_000, 50)
    killed: list[int] = []

    def kill_first_sender(view):  # the real process sending to the broker, SIGKILLed
        if not killed and view["senders"] and 0 < view["rows"] < 100_000:
            killed.append(view["senders"][0])
            os.kill(view["senders"][0], signal.SIGKILL)

    # Spark retries the task (exactly once, by sequence numbers) or gives up on the job; either
    # way the re-run below must leave every row delivered once
    with contextlib.suppress(Exception):
        ingest(
            df,
            orders_broker,
            **SEND,
            **ORDER_COLUMNS,
            ingest_id="killed-1",
            batch_rows=500,
            rows_per_s=40_000,  # 2.5 s at least: the progress views (one a second) see it run
            progress=kill_first_sender,
        )
    rerun = ingest(
        df,
        orders_broker,
        **SEND,
        **ORDER_COLUMNS,
        ingest_id="killed-1",
        progress=False,
    )

    assert killed, "the ingest ended before a sender could be killed"
    assert rerun.rows == 100_000
    got = drain(orders_broker)
    assert len(got) == 100_000 and len({o["id"] for o in got}) == 100_000
    result = reconcile(
        audit_frame(spark, orders_broker), df, ingest_id="killed-1", key="customer", order="ts"
    )
    assert (result.missing, result.doubled, result.out_of_order, result.delivered) == (
        0,
        0,
        0,
        100_000,
    )


def test_rows_failing_validation_are_listed_and_the_rest_delivered(spark, orders_broker):
    good = [("a", 0, '{"id": 0}'), ("a", 1, "not json"), ("a", 2, '{"id": 2}'), ("b", 0, None)]
    df = spark.createDataFrame(good, "customer string, ts long, order string")

    report = ingest(
        df,
        orders_broker,
        **SEND,
        **ORDER_COLUMNS,
        progress=False,
    )

    assert report.sent == 2
    assert [(r["key"], r["position"]) for r in report.rejected] == [("a", 1), ("b", 0)]
    assert "JSON" in report.rejected[0]["reason"] or "json" in report.rejected[0]["reason"]
    assert report.rejected[1]["reason"] == "the body is null"
    assert sorted(o["id"] for o in drain(orders_broker)) == [0, 2]
    result = reconcile(
        audit_frame(spark, orders_broker),
        df,
        ingest_id=report.ingest_id,
        key="customer",
        order="ts",
        rejected=report.rejected,
    )
    assert result.ok and (result.expected, result.delivered) == (2, 2)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"body": "missing"}, IngestError, "'missing' is not in the DataFrame"),
        ({"body": "ts"}, IngestError, "body column 'ts' is bigint"),
        ({"key": "nope"}, IngestError, "key column 'nope' is not in the DataFrame"),
        ({"key": "order"}, IngestError, "key column 'order' is struct"),
        ({"message_type": "NoSuchType"}, UnknownMessageType, "NoSuchType"),
        ({"message_type": "Ack"}, IngestError, "does not let the initiator send 'Ack'"),
        ({"batch_rows": 0}, IngestError, "batch_rows"),
        ({"rows_per_s": 0}, IngestError, "rows_per_s must be a number above 0"),
        ({"rows_per_s": "fast"}, IngestError, "rows_per_s must be a number above 0"),
        ({"rows_per_s": float("nan")}, IngestError, "rows_per_s must be a number above 0"),
        ({"body_format": "xml"}, IngestError, "body_format"),
        ({"ingest_id": "a/b"}, Exception, "ingest_id"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent(
    spark, refusing_broker, change, error, match
):
    df = orders_frame(spark, 10, 2)
    args = {"message_type": "Order", "body": "order", "key": "customer", "order": "ts"} | change

    with pytest.raises(error, match=match):
        ingest(df, refusing_broker, **SEND, **args, progress=False)

    assert_nothing_sent(refusing_broker)


def test_encryption_to_a_far_service_without_a_binding_is_refused_before_anything_is_sent(
    spark, refusing_broker
):
    df = orders_frame(spark, 10, 2)
    far = {**SEND, "to_service": "FarFulfilment"}  # no service here, no binding for it

    with pytest.raises(IngestError, match="no remote service binding for service 'FarFul"):
        ingest(df, refusing_broker, **far, **ORDER_COLUMNS, progress=False)

    assert_nothing_sent(refusing_broker)


def test_a_null_key_and_an_empty_frame_are_refused_before_anything_is_sent(spark, refusing_broker):
    # two null keys among 20,000 rows in 4 partitions: found in the shuffle that arranges the
    # rows, which ends before any partition reaches a sender
    nulls = spark.range(0, 20_000, numPartitions=4).select(
        F.when(F.col("id").isin(7, 12_345), None).otherwise(F.col("id") % 50).alias("customer"),
        F.to_json(F.struct("id")).alias("order"),
    )
    empty = spark.createDataFrame([], "customer string, order string")

    with pytest.raises(IngestError, match="2 rows have a null key in column 'customer'"):
        ingest(nulls, refusing_broker, **SEND, **BY_CUSTOMER, progress=False)
    with pytest.raises(IngestError, match="no rows"):
        ingest(empty, refusing_broker, **SEND, message_type="Order", body="order", progress=False)

    assert_nothing_sent(refusing_broker)


def test_keys_spread_over_several_brokers_and_one_audit_covers_them(spark, make_broker):
    brokers = [make_broker(), make_broker()]
    for b in brokers:
        define_orders(b)
    df = orders_frame(spark, 2000, 30)

    report = ingest(
        df,
        brokers,
        **SEND,
        **ORDER_COLUMNS,
        progress=False,
    )

    counts = [len(drain(b)) for b in brokers]
    assert sum(counts) == 2000 and all(counts)  # both brokers carried some keys
    audit = audit_frame(spark, brokers)
    result = reconcile(audit, df, ingest_id=report.ingest_id, key="customer", order="ts")
    assert result.ok and result.delivered == 2000


def test_without_a_key_each_input_partition_is_one_ordered_dialog(spark, orders_broker):
    df = spark.range(600).select(F.col("id").cast("string").alias("order")).repartition(5).cache()
    cores = spark.sparkContext.defaultParallelism  # 5 partitions, merged whole into this many
    assert arrangement(df, None, None, None).frame.rdd.getNumPartitions() == cores < 5

    report = ingest(df, orders_broker, **SEND, message_type="Order", body="order", progress=False)

    assert (report.rows, report.dialogs) == (600, 5)
    assert sorted(drain(orders_broker)) == list(range(600))
    result = reconcile(audit_frame(spark, orders_broker), df, ingest_id=report.ingest_id)
    assert result.ok and result.delivered == 600


def test_a_group_column_puts_dialogs_of_one_value_in_one_conversation_group(spark, orders_broker):
    rows = [("a", "g1", '{"id": 1}'), ("b", "g1", '{"id": 2}'), ("c", "g2", '{"id": 3}')]
    df = spark.createDataFrame(rows, "customer string, region string, order string")

    ingest(
        df,
        orders_broker,
        **SEND,
        message_type="Order",
        body="order",
        key="customer",
        group="region",
        progress=False,
    )

    groups = [e["conversation_group_id"] for e in orders_broker.endpoints() if e["is_initiator"]]
    assert len(groups) == 3 and len(set(groups)) == 2


def test_the_audit_cursor_reads_incrementally_from_its_checkpoint(spark, orders_broker, tmp_path):
    checkpoint = tmp_path / "audit.json"
    df = orders_frame(spark, 500, 5)
    ingest(
        df,
        orders_broker,
        **SEND,
        message_type="Order",
        body="order",
        key="customer",
        progress=False,
    )
    drain(orders_broker)
    first = AuditCursor(orders_broker, checkpoint).read(spark)

    ingest(
        orders_frame(spark, 300, 3),
        orders_broker,
        **SEND,
        message_type="Order",
        body="order",
        key="customer",
        progress=False,
    )
    drain(orders_broker)
    second = AuditCursor(orders_broker, checkpoint).read(spark)  # a new process, say
    third = AuditCursor(orders_broker, checkpoint).read(spark)

    assert (first.records, second.records, third.records) == (500, 300, 0)
    assert first.complete and second.complete


def test_an_audit_that_rolled_over_is_reported_as_such_not_as_lost_rows(spark, make_broker):
    b = make_broker(limits={"audit_rows": 1, "prune_every_s": 0.05})
    define_orders(b)
    df = orders_frame(spark, 400, 4)
    report = ingest(
        df,
        b,
        **SEND,
        **ORDER_COLUMNS,
        progress=False,
    )
    for _ in range(4):  # one commit per customer
        got = b.receive("FulfilmentQueue", top=100_000)
        b.commit(got)

    def rolled_over():
        read = audit_frame(spark, b)
        return None if read.complete else read

    audit = wait_until(rolled_over, what="the audit to drop commits past its bound")

    result = reconcile(audit, df, ingest_id=report.ingest_id, key="customer", order="ts")

    assert not result.audit_complete and not result.ok
    assert result.missing == 0 and result.unaccounted > 0
    assert "rolled over" in result.summary()


def test_the_command_line_ingests_a_parquet_file_and_reconciles_its_audit(
    spark, orders_broker, tmp_path, capsys
):
    from actors.tools.cli import main

    source, report = str(tmp_path / "orders.parquet"), str(tmp_path / "report.json")
    out, per_key = str(tmp_path / "audit.parquet"), str(tmp_path / "per_key.parquet")
    orders_frame(spark, 1500, 12).write.parquet(source)
    broker = ["--broker", orders_broker.name]
    sends = ["--from-service", "Orders", "--to-service", "Fulfilment"]
    sends += ["--contract", "OrderContract", "--message-type", "Order"]

    assert (
        main(
            [
                "ingest",
                source,
                *broker,
                *sends,
                "--body",
                "order",
                "--key",
                "customer",
                "--order",
                "ts",
                "--ingest-id",
                "cli-1",
                "--report",
                report,
            ]
        )
        == 0
    )
    assert len(drain(orders_broker)) == 1500
    assert (
        main(
            [
                "audit",
                *broker,
                "--out",
                out,
                "--reconcile",
                source,
                "--ingest-report",
                report,
                "--per-key",
                per_key,
            ]
        )
        == 0
    )

    printed = capsys.readouterr().out
    assert "ingest cli-1: 1,500 rows, 1,500 sent, 12 dialogs, 0 rejected" in printed
    assert "1,500 delivered once, 0 missing, 0 doubled, 0 out of order" in printed
    assert spark.read.parquet(out).count() == 1500
    assert {r["key"]: r["delivered"] for r in spark.read.parquet(per_key).collect()} == {
        str(k): 125 for k in range(12)
    }
    with open(report) as f:
        assert json.load(f)["ingest_id"] == "cli-1"


def test_the_audit_command_needs_the_ingest_report_to_reconcile(orders_broker, tmp_path, capsys):
    from actors.tools.cli import main

    code = main(
        [
            "audit",
            "--broker",
            orders_broker.name,
            "--out",
            str(tmp_path / "a"),
            "--reconcile",
            str(tmp_path / "in.parquet"),
        ]
    )

    assert code == 2 and "--reconcile needs --ingest-report" in capsys.readouterr().err


def test_bench_ingest_measures_the_ingest_beside_the_driver_loop_and_checks_delivery(tmp_path):
    """A smoke test of the command, run as a user runs it: in a process of its own, with a Ray
    of its own and a Spark session of its own for each run (the second run's session once
    failed to start while the first's Spark master still held its name); its shape and its
    checks, at a small size, two runs (--quick: no warm-up)."""
    path = tmp_path / "ingest.json"
    args = ["bench", "ingest", "--quick", "--messages", "3000", "--repeats", "2"]
    run = in_own_process(["-m", "actors.tools.cli", *args, "--json", str(path)], 600, quiet=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]

    report = json.loads(path.read_text())
    rows = {(r["system"], r["variant"]): r for r in report["rows"]}
    assert report["scenario"] == "ingest" and report["params"]["rows"] == 3000
    for key in [
        ("raybroker", "ingest (executors)"),
        ("raybroker", "ingest (input partitioned by key)"),
        ("driver-loop", "toPandas + apply"),
        ("raybroker", "broker send-only"),
    ]:
        assert rows[key]["messages_per_s"] > 0
        assert (rows[key]["lost"], rows[key]["doubled"], rows[key]["out_of_order"]) == (0, 0, 0)
    assert "x driver-loop" in rows[("raybroker", "ingest (executors)")]["notes"]
    assert "not shuffled" in rows[("raybroker", "ingest (input partitioned by key)")]["notes"]
