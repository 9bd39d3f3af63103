"""Fetch delta-spark (the release built for the installed PySpark) and its runtime
dependencies from Maven Central into the git-ignored dev/delta-lib/<version>/, for sessions
that read the topics' Delta tables (docs/spark.md, "Delta tables"); dev/setup.sh runs it.

    .venv/bin/python dev/fetch_delta_jars.py [--s3a]

``--s3a`` also fetches hadoop-aws (PySpark's Hadoop version) and the AWS SDK v2 bundle (about
690 MB) into the git-ignored dev/s3a-lib/<hadoop version>/, for sessions that read ``s3://``
tables (docs/spark.md, "Delta tables on S3"). Needs Maven (mvn). Exit status: 0 fetched or present (prints the folder), 2 not fetchable here
(no delta-spark release for this PySpark, no Maven, or Maven failed: the reason is printed).
The code is :mod:`txlake.spark_connector.delta`.
"""

import sys

from txlake.spark_connector.delta import main

if __name__ == "__main__":
    sys.exit(main())
