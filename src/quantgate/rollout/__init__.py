"""Canary rollout: evidence, decisions, release moves."""
