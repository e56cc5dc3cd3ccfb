#!/usr/bin/env bash
# A 3-broker Apache Kafka cluster (KRaft, each node broker and controller) on 127.0.0.1, for spate's
# cluster mode and its tests. Kafka's jars come from Maven Central through Maven and run on the machine's
# Java 17; nothing else is installed.
#
#   scripts/kafka.sh start DIR [PORT_BASE]   format (first time) and start the three nodes; prints the
#                                            bootstrap servers once every broker accepts connections
#   scripts/kafka.sh stop DIR                stop the nodes (SIGTERM, then SIGKILL after 20 s)
#   scripts/kafka.sh start-node DIR N        start node N (1-3) again, e.g. after killing it
#   scripts/kafka.sh bootstrap DIR           print the bootstrap servers
#   scripts/kafka.sh topics DIR ARGS...      Kafka's topic tool against the cluster, e.g.
#                                            `topics DIR --describe --topic spate-journal`
#   scripts/kafka.sh configs DIR ARGS...     Kafka's config tool, e.g. `configs DIR --alter --entity-type
#                                            topics --entity-name T --add-config max.message.bytes=64`
#   scripts/kafka.sh fetch                   only download the jars
#
# Node N listens on PORT_BASE+N-1 (clients) and PORT_BASE+100+N-1 (controllers); PORT_BASE defaults to
# 19092. DIR holds each node's configuration, data, log and pid. Failure detection is tuned short
# (a broker is declared dead after 3 s) so that tests see failover in seconds, not tens of seconds.
set -euo pipefail

KAFKA_VERSION=4.1.0
LOG4J_VERSION=2.24.3
CACHE=${SPATE_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spate/kafka-$KAFKA_VERSION}
HEAP=${SPATE_KAFKA_HEAP:--Xms128m -Xmx384m}
NODES=3

die() {
	echo "kafka.sh: $*" >&2
	exit 1
}

fetch() {
	[[ -f $CACHE/libs/.complete ]] && return
	command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch Kafka's jars from Maven Central"
	command -v java >/dev/null || die "Java 17 or newer is needed to run Kafka"
	mkdir -p "$CACHE"
	cat >"$CACHE/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>spate</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
	echo "kafka.sh: fetching Kafka $KAFKA_VERSION from Maven Central into $CACHE" >&2
	mvn -q -B -f "$CACHE/pom.xml" dependency:copy-dependencies -DoutputDirectory="$CACHE/libs" >&2 ||
		die "could not fetch Kafka's jars with Maven"
	touch "$CACHE/libs/.complete"
}

port() { echo $(($1 + $2 - 1)); }

bootstrap() {
	local dir=$1 base
	base=$(cat "$dir/port-base")
	local servers=()
	for n in $(seq 1 $NODES); do servers+=("127.0.0.1:$(port "$base" "$n")"); done
	(
		IFS=,
		echo "${servers[*]}"
	)
}

configure() {
	local dir=$1 base=$2 voters=()
	for n in $(seq 1 $NODES); do voters+=("$n@127.0.0.1:$(port "$((base + 100))" "$n")"); done
	local voter_list
	voter_list=$(
		IFS=,
		echo "${voters[*]}"
	)
	for n in $(seq 1 $NODES); do
		mkdir -p "$dir/node$n"
		cat >"$dir/node$n/server.properties" <<EOF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voter_list
listeners=PLAINTEXT://127.0.0.1:$(port "$base" "$n"),CONTROLLER://127.0.0.1:$(port "$((base + 100))" "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(port "$base" "$n")
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/node$n/data
auto.create.topics.enable=false
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=6
group.initial.rebalance.delay.ms=0
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500
controller.quorum.fetch.timeout.ms=1000
controller.quorum.election.timeout.ms=500
message.max.bytes=16777216
replica.fetch.max.bytes=16777216
EOF
		cat >"$dir/node$n/log4j2.properties" <<EOF
appender.file.type=File
appender.file.name=file
appender.file.fileName=$dir/node$n/server.log
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
rootLogger.level=WARN
rootLogger.appenderRef.file.ref=file
logger.kafka.name=kafka
logger.kafka.level=INFO
EOF
	done
	echo "$base" >"$dir/port-base"
}

format() {
	local dir=$1 cluster_id
	# 16 random bytes, URL-safe base64 without padding: Kafka's cluster id format. It can start with
	# "-", so it is passed as --cluster-id=ID, never as a separate argument.
	cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
	for n in $(seq 1 $NODES); do
		java -cp "$CACHE/libs/*" -Dlog4j2.configurationFile="$dir/node$n/log4j2.properties" \
			kafka.tools.StorageTool format --cluster-id="$cluster_id" -c "$dir/node$n/server.properties" >/dev/null ||
			die "formatting node $n failed"
	done
	echo "$cluster_id" >"$dir/cluster-id"
}

running() {
	local pidfile=$1/node$2/pid
	[[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

start_node() {
	local dir=$1 n=$2
	running "$dir" "$n" && return
	# setsid: the node outlives the shell that started it and gets no signal meant for that shell's group.
	# shellcheck disable=SC2086
	setsid java $HEAP -XX:+UseG1GC -Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$dir/node$n/log4j2.properties" \
		-cp "$CACHE/libs/*" kafka.Kafka "$dir/node$n/server.properties" \
		>"$dir/node$n/stdout.log" 2>&1 </dev/null &
	echo $! >"$dir/node$n/pid"
}

wait_ready() {
	local dir=$1 base deadline=$((SECONDS + ${SPATE_KAFKA_START_TIMEOUT_S:-90}))
	base=$(cat "$dir/port-base")
	for n in $(seq 1 $NODES); do
		until (: </dev/tcp/127.0.0.1/"$(port "$base" "$n")") 2>/dev/null; do
			running "$dir" "$n" || die "node $n exited; see $dir/node$n/server.log and stdout.log"
			((SECONDS < deadline)) || die "node $n did not accept connections in time"
			sleep 0.2
		done
	done
}

stop() {
	local dir=$1
	for n in $(seq 1 $NODES); do
		running "$dir" "$n" && kill "$(cat "$dir/node$n/pid")" 2>/dev/null || true
	done
	local deadline=$((SECONDS + 20))
	for n in $(seq 1 $NODES); do
		while running "$dir" "$n" && ((SECONDS < deadline)); do sleep 0.2; done
		running "$dir" "$n" && kill -9 "$(cat "$dir/node$n/pid")" 2>/dev/null || true
		rm -f "$dir/node$n/pid"
	done
}

command=${1:-}
case $command in
fetch) fetch ;;
start)
	dir=${2:?usage: kafka.sh start DIR [PORT_BASE]}
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	fetch
	if [[ ! -f $dir/cluster-id ]]; then
		configure "$dir" "${3:-19092}"
		format "$dir"
	fi
	for n in $(seq 1 $NODES); do start_node "$dir" "$n"; done
	wait_ready "$dir"
	bootstrap "$dir"
	;;
start-node)
	dir=$(cd "${2:?usage: kafka.sh start-node DIR N}" && pwd)
	n=${3:?usage: kafka.sh start-node DIR N}
	start_node "$dir" "$n"
	wait_ready "$dir"
	;;
stop) stop "${2:?usage: kafka.sh stop DIR}" ;;
bootstrap) bootstrap "${2:?usage: kafka.sh bootstrap DIR}" ;;
topics | configs)
	dir=${2:?usage: kafka.sh $command DIR ARGS...}
	shift 2
	fetch
	class=org.apache.kafka.tools.TopicCommand
	[[ $command == configs ]] && class=kafka.admin.ConfigCommand
	java -cp "$CACHE/libs/*" -Dlog4j2.configurationFile="$dir/node1/log4j2.properties" \
		"$class" --bootstrap-server "$(bootstrap "$dir")" "$@"
	;;
*) die "usage: kafka.sh start DIR [PORT_BASE] | stop DIR | start-node DIR N | bootstrap DIR | topics DIR ARGS... | configs DIR ARGS... | fetch" ;;
esac
