"""RL post-training: tasks, the learner, recipes and the training loop (``scifolio posttrain rl``)."""
