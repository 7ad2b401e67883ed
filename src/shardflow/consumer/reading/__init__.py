"""The consumer's reading stage."""
