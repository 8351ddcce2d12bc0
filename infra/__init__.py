"""Local infrastructure the project starts itself: a Kafka broker resolved from Maven Central, and its command line."""
