"""Memory Decoder end to end (SPEC §C9): token datastore → kNN targets (Eq 1) → memory (Eq 2) → router (Eq 4) →
fused decoding (Eq 3) and its held-out measurement. The equations live in ``posttrain/objectives/memory_decoder.py``.

    scifolio memdec prepare --config debug --work-dir out/memdec   # then build-datastore, train, train-router, eval
"""
