"""The consumer's checkpointing stage."""
