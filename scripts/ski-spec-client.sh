#!/usr/bin/env bash
# Checks that a client generated from the Ski Data API spec works unchanged against `spate serve`.
#
# Downloads swagger-codegen (from Maven Central), generates the Java client from
# crates/apps/ski/spec/ski-api.yaml as the course's clients were generated, builds it with Maven, starts a
# fresh spate server, and runs scripts/ski-spec-client/SpecClient.java: THREADS threads x POSTS lift rides,
# then every GET of the spec checked against the rides. Needs a JDK (11+) and Maven.
# Usage: scripts/ski-spec-client.sh [THREADS] [POSTS_PER_THREAD]    (default 32 1000)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-32}
posts=${2:-1000}
codegen_version=3.0.61

work=$(mktemp -d)
server_pid=""
cleanup() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

jar=target/swagger-codegen-cli-$codegen_version.jar
if [ ! -f "$jar" ]; then
    mkdir -p target
    curl -sSfL -o "$jar" \
        "https://repo1.maven.org/maven2/io/swagger/codegen/v3/swagger-codegen-cli/$codegen_version/swagger-codegen-cli-$codegen_version.jar"
fi
java -jar "$jar" generate -l java -i crates/apps/ski/spec/ski-api.yaml -o "$work/client" \
    --api-package io.swagger.client.api --model-package io.swagger.client.model \
    --invoker-package io.swagger.client >/dev/null
# The generated pom predates Java 11, which no longer ships javax.annotation; the course's students added it.
sed -i 's#<dependencies>#<dependencies><dependency><groupId>javax.annotation</groupId><artifactId>javax.annotation-api</artifactId><version>1.3.2</version></dependency>#' \
    "$work/client/pom.xml"
(cd "$work/client" && mvn -q -DskipTests -Dmaven.javadoc.skip=true package dependency:copy-dependencies)
classpath="$work/client/target/classes:$work/client/target/dependency/*"
javac -cp "$classpath" -d "$work/check" scripts/ski-spec-client/SpecClient.java

cargo build --release -q
target/release/spate serve --apps ski --listen 127.0.0.1:0 --data-dir "$work/data" \
    >"$work/announce" 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 100); do
    grep -q "listening on" "$work/announce" && break
    sleep 0.1
done
base=$(sed -n 's/^spate listening on //p' "$work/announce")
[ -n "$base" ] || { cat "$work/server.log"; exit 1; }

java -cp "$classpath:$work/check" SpecClient "$base" "$threads" "$posts"
