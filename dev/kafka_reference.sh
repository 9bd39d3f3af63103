#!/usr/bin/env bash
# Fetches Apache Kafka (the broker org.apache.kafka:kafka_2.13 and the tools
# org.apache.kafka:kafka-tools, with every runtime dependency, and slf4j-simple so it logs) from Maven Central into the
# git-ignored dev/kafka-lib/, for the differential tests (tests/test_differential_*.py,
# fixture `apache_kafka` in tests/conftest.py) and the benchmarks' reference
# (benchmarks/bench_server*.py). Needs Java 17+ and Maven (mvn). dev/test.sh runs it.
#
# Idempotent: when dev/kafka-lib/ holds a complete copy of KAFKA_VERSION (the marker file
# written last) it does nothing. Exit status: 0 present or fetched; 2 not fetchable here
# (no mvn, or Maven failed: its output is printed). The broker then runs as
#   java -cp 'dev/kafka-lib/*' kafka.Kafka server.properties
set -euo pipefail
cd "$(dirname "$0")/.."
KAFKA_VERSION="${KAFKA_VERSION:-4.3.1}"
LAYOUT=2   # bump when the set of artifacts below changes, so present copies are refetched   # 4.4.0's kafka-tools needs packages Maven Central here does not serve
LIB=dev/kafka-lib
MARKER="$LIB/.complete-$KAFKA_VERSION-$LAYOUT"
if [ -f "$MARKER" ]; then
  exit 0
fi
# one fetch at a time (pytest workers may call this together): wait for the lock, look again
mkdir -p dev
exec 9>dev/.kafka-lib.lock
flock 9
if [ -f "$MARKER" ]; then
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "dev/kafka_reference.sh: mvn (Apache Maven) is not installed; Apache Kafka $KAFKA_VERSION was not fetched" >&2
  exit 2
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txlake.dev</groupId>
  <artifactId>kafka-reference</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>$KAFKA_VERSION</version>
    </dependency>
    <!-- the broker logs through SLF4J 1.7 (slf4j-api 1.7.36 comes with Kafka); without a
         binding it logs nothing. slf4j-simple writes to stderr, level set by the
         -Dorg.slf4j.simpleLogger.defaultLogLevel system property -->
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>1.7.36</version>
    </dependency>
  </dependencies>
</project>
EOF
echo "dev/kafka_reference.sh: fetching Apache Kafka $KAFKA_VERSION into $LIB/ with Maven" >&2
rm -rf "$LIB.partial"
mkdir -p "$LIB.partial"
if ! mvn -q -B -f "$WORK/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$PWD/$LIB.partial" >"$WORK/mvn.log" 2>&1; then
  tail -n 40 "$WORK/mvn.log" >&2
  echo "dev/kafka_reference.sh: Maven could not fetch Apache Kafka $KAFKA_VERSION (see above)" >&2
  rm -rf "$LIB.partial"
  exit 2
fi
if ! ls "$LIB.partial"/kafka_2.13-"$KAFKA_VERSION".jar "$LIB.partial"/kafka-tools-"$KAFKA_VERSION".jar >/dev/null 2>&1; then
  echo "dev/kafka_reference.sh: Maven finished but kafka_2.13-$KAFKA_VERSION.jar or kafka-tools-$KAFKA_VERSION.jar is missing" >&2
  rm -rf "$LIB.partial"
  exit 2
fi
rm -rf "$LIB"
mv "$LIB.partial" "$LIB"
touch "$MARKER"
echo "dev/kafka_reference.sh: Apache Kafka $KAFKA_VERSION is in $LIB/ ($(ls "$LIB"/*.jar | wc -l) jars)" >&2
