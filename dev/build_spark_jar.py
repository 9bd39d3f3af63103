"""Build txlake's Spark jar (``txlake.DefaultSource``, spark_connector/java/) into the
git-ignored spark_connector/java/build/, for the installed PySpark; dev/setup.sh runs it.

    .venv/bin/python dev/build_spark_jar.py [--force]

Needs a JDK 17+ (``javac``). Exit status: 0 built or up to date (prints the jar's path),
2 not buildable here (no JDK or no PySpark: txlake works without the jar, but Spark then
refuses the default save mode of ``df.write.format("txlake")``, docs/spark.md), 1 javac failed.
The code is :mod:`txlake.spark_connector.jvm`.
"""

import sys

from txlake.spark_connector.jvm import main

if __name__ == "__main__":
    sys.exit(main())
