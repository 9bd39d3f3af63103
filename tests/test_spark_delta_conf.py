"""delta-spark on Spark sessions (txlake.spark_connector.delta): which release fits which
Spark, and the settings a session gets. No JVM here; reading the topics' Delta tables with
Spark is tests/test_tables_spark.py."""

import pytest

from txlake.spark_connector import delta
from txlake.spark_connector.delta import DeltaUnavailableError


def test_the_release_is_the_one_built_for_the_spark_minor_version():
    # each delta-spark POM names the Spark it is compiled against (4.4.0: spark-sql 4.2.0, ...)
    assert delta.delta_version("4.2.1") == "4.4.0"
    assert delta.delta_version("4.1.0") == "4.3.1"
    assert delta.delta_version("4.0.1") == "4.0.1"
    assert delta.delta_coordinates("4.2.0") == "io.delta:delta-spark_2.13:4.4.0"


def test_a_spark_without_a_delta_release_is_refused_naming_the_versions_that_have_one():
    with pytest.raises(DeltaUnavailableError) as e:
        delta.delta_version("4.3.0")
    assert str(e.value).startswith("no delta-spark release is built for Spark 4.3.0 (PySpark's version)")
    assert "Spark 4.2: delta-spark 4.4.0" in str(e.value)


def test_without_fetched_jars_the_session_downloads_only_when_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("TXLAKE_DELTA_LIB", str(tmp_path))
    assert delta.delta_jars("4.2.1") is None
    with pytest.raises(DeltaUnavailableError, match=r"delta-spark 4\.4\.0's jars are not in .*dev/fetch_delta_jars\.py"):
        delta.delta_conf("4.2.1")
    assert delta.delta_conf("4.2.1", allow_download=True) == {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.jars.packages": "io.delta:delta-spark_2.13:4.4.0"}


def test_fetched_jars_join_the_sessions_own_jars(tmp_path, monkeypatch):
    monkeypatch.setenv("TXLAKE_DELTA_LIB", str(tmp_path))
    folder = tmp_path / "4.4.0"
    folder.mkdir()
    (folder / "delta-spark_2.13-4.4.0.jar").write_bytes(b"")
    (folder / "delta-storage-4.4.0.jar").write_bytes(b"")
    assert delta.delta_jars("4.2.1") is None  # no completion marker: a fetch that stopped half way
    (folder / ".complete").write_text("4.4.0\n")
    conf = delta.delta_session_conf({"spark.jars": "/x/txlake.jar", "spark.ui.enabled": "false"}, "4.2.1")
    assert conf["spark.jars"] == f"/x/txlake.jar,{folder}/delta-spark_2.13-4.4.0.jar,{folder}/delta-storage-4.4.0.jar"
    assert conf["spark.databricks.delta.snapshotPartitions"] == "1"
    assert conf["spark.ui.enabled"] == "false"
    assert "spark.jars.packages" not in conf
