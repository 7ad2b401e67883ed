"""shardflow: Python-native toolkit for Amazon Kinesis Data Streams."""
