"""The demo: realistic events through the whole shardflow path on the local stack."""
