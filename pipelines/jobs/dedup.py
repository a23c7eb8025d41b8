"""Near-duplicate removal as a Beam transform (the logic is ``pipelines.assembly.dedup``; this is the wiring).

    result = texts | NearDuplicates(DedupConfig())      # texts: PCollection of (doc_id, [page text] | None)
    result["kept"]     # doc ids to build
    result["dropped"]  # Dropped(doc_id, "dedup", "near_duplicate", {"kept": ..., "similarity": ...}).to_row()
    result["duplicates"]  # one element: {dropped doc_id: (kept doc_id, similarity)}, for a side input

In the corpus job (before ProcessDocument, after the exact-duplicate step), keeping the (doc_id, path) pairs:
    near = unique.docs | "FirstPagesText" >> beam.ParDo(FirstPagesText(cfg)) | "NearDup" >> NearDuplicates(cfg)
    docs = unique.docs | beam.Filter(lambda kv, dup: kv[0] not in dup, dup=AsSingleton(near["duplicates"]))

Graph: signature per document → one (band key, (doc_id, signature)) per LSH band → GroupByKey → verified
pairs per bucket → Distinct → all pairs in one place (duplicates are few) → connected components, smallest
doc_id kept → kept ids / dead letters via that map as a side input. Every step is a function of the set of
documents, never of their order or of which worker saw what.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipelines.assembly.dedup import DedupConfig, band_keys, bucket_pairs, near_duplicate, resolve, signature

NAMESPACE = "scifolio"


class NearDuplicates(beam.PTransform):
    """(doc_id, first pages' text per page or None) → {"kept": doc ids, "dropped": dead-letter rows}."""

    def __init__(self, config: DedupConfig) -> None:
        super().__init__()
        self.config = config

    def expand(self, texts: beam.PCollection) -> dict[str, beam.PCollection]:
        config = self.config

        def sign(element: tuple[str, Any]) -> Iterable[tuple[str, bytes]]:
            doc_id, pages = element
            sig = signature(pages, config) if pages else None
            if sig is None:
                Metrics.counter(NAMESPACE, "dedup.no_signature").inc()
                return
            yield doc_id, sig

        def candidates(element: tuple[str, Iterable[tuple[str, bytes]]]) -> Iterable[tuple[str, str, float]]:
            _, members = element
            members = list(members)
            if len(members) > 1:
                yield from bucket_pairs(members, config)

        def clusters(pairs: list[tuple[str, str, float]]) -> dict[str, tuple[str, float]]:
            return resolve(sorted(pairs))

        def split(doc_id: str, dup: dict[str, tuple[str, float]]) -> Iterable[Any]:
            if doc_id in dup:
                kept, sim = dup[doc_id]
                Metrics.counter(NAMESPACE, "dropped.dedup.near_duplicate").inc()
                yield beam.pvalue.TaggedOutput("dropped", near_duplicate(doc_id, kept, sim).to_row())
            else:
                yield doc_id

        sigs = texts | "Signature" >> beam.FlatMap(sign)
        duplicates = (
            sigs
            | "BandKeys" >> beam.FlatMap(lambda kv: [(key, kv) for key in band_keys(kv[1], config)])
            | "ByBand" >> beam.GroupByKey()
            | "VerifyPairs" >> beam.FlatMap(candidates)
            | "DistinctPairs" >> beam.Distinct()
            | "AllPairs" >> beam.combiners.ToList()
            | "Clusters" >> beam.Map(clusters)
        )
        out = (
            texts
            | "DocIds" >> beam.Map(lambda kv: kv[0])
            | "Split"
            >> beam.FlatMap(split, dup=beam.pvalue.AsSingleton(duplicates)).with_outputs("dropped", main="kept")
        )
        return {"kept": out.kept, "dropped": out.dropped, "duplicates": duplicates}


class FirstPagesText(beam.DoFn):
    """(doc_id, path) → (doc_id, [page text] | None): the text layer of the first pages, before any parsing."""

    def __init__(self, config: DedupConfig) -> None:
        self.config = config

    def process(self, element: tuple[str, str]) -> Iterable[tuple[str, Any]]:
        from apache_beam.io.filesystems import FileSystems

        from pipelines.assembly.dedup import first_pages_text

        doc_id, path = element
        with FileSystems.open(path) as f:
            data = f.read()
        yield doc_id, first_pages_text(data, self.config)
