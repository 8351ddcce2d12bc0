"""Local infrastructure the project starts itself (Kafka, Flink, PostgreSQL, an S3 server, the Prefect server), and
Kafka administration: a broker resolved from Maven Central, topic setup and the reachability check (its command line
is :mod:`precursor.kafka_cli`)."""
