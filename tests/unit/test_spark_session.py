"""The Spark session's settings (spark_bridge/session.py), as given to RayDP. No Spark, no Ray."""

from __future__ import annotations

from spark_bridge.session import short_jobs_configs, spark_configs
from spark_bridge.worker_daemon import without_jars


def _options(conf: dict[str, str], jvm: str) -> list[str]:
    return conf[f"spark.{jvm}.extraJavaOptions"].split()


def test_the_driver_and_master_compile_with_the_first_tier_and_the_executors_with_both():
    conf = spark_configs(1.0)
    for jvm in ("driver", "ray.raydp_app_master"):
        assert "-XX:TieredStopAtLevel=1" in _options(conf, jvm), jvm
    executor = _options(conf, "executor")
    assert not any(o.startswith("-XX:TieredStopAtLevel") for o in executor)
    assert "-XX:+UseParallelGC" in executor
    for jvm in ("driver", "executor", "ray.raydp_app_master"):  # JDK 17's openings, on all
        assert "--add-opens=java.base/java.nio=ALL-UNNAMED" in _options(conf, jvm), jvm


def test_a_short_jobs_session_puts_every_jvm_on_the_first_tier_and_one_gc_thread():
    conf = spark_configs(1.0, short_jobs_configs())
    for jvm in ("driver", "executor", "ray.raydp_app_master"):
        options = _options(conf, jvm)
        assert {"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"} <= set(options), jvm
        assert "-XX:+UseParallelGC" not in options, jvm  # one collector only
        assert "--add-opens=java.base/java.nio=ALL-UNNAMED" in options, jvm


def test_settings_given_by_the_caller_win():
    conf = spark_configs(0.5, {"spark.sql.shuffle.partitions": "9"}, cores=4)
    assert conf["spark.sql.shuffle.partitions"] == "9"
    assert conf["spark.ray.raydp_spark_executor.actor.resource.cpu"] == "0.5"


def test_the_workers_daemon_is_the_bridges_and_drops_only_jar_files(tmp_path):
    assert spark_configs(1.0)["spark.python.daemon.module"] == "spark_bridge.worker_daemon"
    jar, folder = tmp_path / "spark-core.jar", tmp_path / "lib.jar"
    jar.write_bytes(b"PK")
    folder.mkdir()  # a directory named like a jar is a directory: kept
    paths = [str(tmp_path), str(jar), str(folder), "/nowhere/x.jar"]
    assert without_jars(paths) == [str(tmp_path), str(folder), "/nowhere/x.jar"]


def test_the_drivers_agent_logs_to_the_connected_nodes_directory_whatever_the_caller_set():
    conf = spark_configs(1.0, short_jobs_configs(), ray_logs="/tmp/rb/session_1/logs")
    driver = _options(conf, "driver")
    assert driver[-1] == "-Dray.logging.dir=/tmp/rb/session_1/logs"
    assert "-XX:+UseSerialGC" in driver  # the caller's options stay
    assert not any("ray.logging.dir" in o for o in _options(conf, "executor"))
    assert not any("ray.logging.dir" in o for o in _options(spark_configs(1.0), "driver"))
