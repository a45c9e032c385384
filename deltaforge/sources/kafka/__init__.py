"""Kafka source: topics read with an aiokafka consumer group, offsets committed after delivery."""
