"""Image index: embed crops from shards, sharded Milvus collections, text/image search, rerank, sample weights.

scifolio index build --shards out --uri ./index.db --collections 4 --embed-model tiny/retrieval/clip
scifolio index query "phase diagram of a binary alloy" --k 10 --rerank
"""
