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


def test_s3fs_storage_options_map_to_s3a_settings_per_bucket():
    options = {"endpoint_url": "http://127.0.0.1:8333", "key": "ak", "secret": "sk",
               "client_kwargs": {"region_name": "us-east-1"}}
    impl = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A"}
    b = "fs.s3a.bucket.lake."
    assert delta.s3a_conf(options, bucket="lake") == {
        **impl, b + "endpoint": "http://127.0.0.1:8333", b + "path.style.access": "true",
        b + "connection.ssl.enabled": "false", b + "access.key": "ak", b + "secret.key": "sk",
        b + "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        b + "endpoint.region": "us-east-1"}
    assert delta.s3a_conf({"key": "ak", "secret": "sk", "token": "st"}) == {
        **impl, "fs.s3a.access.key": "ak", "fs.s3a.secret.key": "sk", "fs.s3a.session.token": "st",
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"}
    assert delta.s3a_conf({"anon": True}) == {
        **impl, "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"}
    assert delta.s3a_conf(None) == impl  # S3A's default AWS credential chain


def test_an_s3fs_option_without_an_s3a_equivalent_is_refused_naming_it():
    with pytest.raises(ValueError) as e:
        delta.s3a_conf({"key": "ak", "requester_pays": True, "client_kwargs": {"verify": False}})
    assert str(e.value) == ("storage options requester_pays, client_kwargs.verify have no S3A equivalent "
                            "(supported: endpoint_url, key, secret, token, anon, client_kwargs.region_name)")


def test_without_fetched_s3a_jars_the_session_conf_names_the_script(tmp_path, monkeypatch):
    monkeypatch.setenv("TXLAKE_S3A_LIB", str(tmp_path))
    version = delta.hadoop_version()
    assert delta.s3a_jars() is None
    with pytest.raises(DeltaUnavailableError, match=rf"hadoop-aws {version}'s jars are not in .*fetch_delta_jars\.py --s3a"):
        delta.s3a_session_conf({})
    folder = tmp_path / version
    folder.mkdir()
    for name in (f"hadoop-aws-{version}.jar", "bundle-2.35.4.jar", ".complete"):
        (folder / name).write_bytes(b"")
    conf = delta.s3a_session_conf({"spark.driver.extraClassPath": "/x/a.jar"}, {"endpoint_url": "https://s3.example"})
    assert conf["spark.driver.extraClassPath"] == f"/x/a.jar:{folder}/bundle-2.35.4.jar:{folder}/hadoop-aws-{version}.jar"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "https://s3.example"
    assert "spark.hadoop.fs.s3a.connection.ssl.enabled" not in conf
    assert conf["spark.delta.logStore.s3.impl"] == "io.delta.storage.S3SingleDriverLogStore"


def test_the_hadoop_version_is_the_one_pyspark_ships():
    import pyspark

    if not pyspark.__version__.startswith("4.2."):
        pytest.skip(f"the Hadoop of PySpark {pyspark.__version__} is not pinned here")
    assert delta.hadoop_version() == "3.5.0"  # pyspark/jars/hadoop-client-api-3.5.0.jar
