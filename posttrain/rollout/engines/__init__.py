"""``RolloutEngine`` implementations: ``hf`` (transformers, CPU), ``scripted`` (tests), ``vllm`` (GPU, lazy)."""
