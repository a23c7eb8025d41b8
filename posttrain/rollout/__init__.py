"""Rollout side of RL post-training: the request/trajectory types, the engine protocol, engines, schedulers."""
