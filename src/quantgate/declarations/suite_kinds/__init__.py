"""One module per suite kind: its YAML's model and what a floor may name on it (``@declare``)."""
