"""Formats that cross areas, in one leaf package (it imports nothing else of the project).

records (Document/Page/Block/Crop/Dropped), shards (schema, lister, typed reader/writer), weights (sample
weights), manifest (``OUT/manifest.json``), quarantine (dead-letter files), scores (typed stage scores), fs
(the one filesystem layer: local paths and fsspec URLs, committed writes).
"""
