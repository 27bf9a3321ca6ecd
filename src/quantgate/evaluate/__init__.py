"""Evaluation suites: run the source and each artifact on the same inputs and score them."""
