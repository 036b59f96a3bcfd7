"""Rollout strategies; importing this package registers them."""
