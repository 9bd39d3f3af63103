#!/usr/bin/env bash
# Creates .venv (Python 3.11+) and installs txlake with its test extras into it.
# Safe to run again: it only installs what is missing or changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# editable install; txlake's build backend (dev/txlake_build.py) adds spark_discovery/ to sys.path,
# so Spark finds format("txlake") from any working directory (docs/spark.md)
.venv/bin/python -m pip install --quiet -e ".[test]"
# txlake's Spark jar (txlake.DefaultSource: df.write.format("txlake") in Spark's default save
# mode, docs/spark.md), compiled from spark_connector/java/ into a git-ignored folder; needs a
# JDK 17+ (javac). Without it everything else works and the write needs mode("append").
.venv/bin/python dev/build_spark_jar.py || echo "note: txlake's Spark jar was not built (see above); docs/spark.md, Writing"
# Apache Kafka itself (broker and tools jars, Maven Central) into the git-ignored dev/kafka-lib/:
# the reference the differential tests and the server benchmarks compare txlake serve with
# (a no-op when present). Without Maven those tests fail naming this script.
./dev/kafka_reference.sh || echo "note: Apache Kafka's jars were not fetched (see above); the differential tests will fail until dev/kafka_reference.sh succeeds"
# delta-spark (the release built for this PySpark) into the git-ignored dev/delta-lib/, for Spark
# sessions that read the topics' Delta tables (docs/spark.md, "Delta tables"; a no-op when present).
# Some PySpark versions have no delta-spark release yet: the note says so and the tests that need it skip.
.venv/bin/python dev/fetch_delta_jars.py || echo "note: delta-spark's jars were not fetched (see above); docs/spark.md, Delta tables"
# Hadoop's S3A (hadoop-aws of PySpark's Hadoop version and the AWS SDK v2 bundle, about 690 MB)
# into the git-ignored dev/s3a-lib/, for Spark sessions that read s3:// Delta tables (docs/spark.md,
# "Delta tables on S3"; a no-op when present). Without it the s3 case of tests/test_tables_spark.py fails naming this.
.venv/bin/python dev/fetch_delta_jars.py --s3a || echo "note: Hadoop's S3A jars were not fetched (see above); Spark cannot read s3:// Delta tables (docs/spark.md, Delta tables on S3)"
