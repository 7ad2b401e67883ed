"""Helpers for testing code that uses shardflow (and shardflow itself) without AWS."""
