"""Visual pre-training: shard stream (data), frozen-encoder model, Eq 5–9 objective, DeepSpeed loop (train).

scifolio pretrain --config debug --shards out --models tiny --max-steps 50
"""
