"""The consumer's lifecycle stage."""
