"""The corpus job on Beam's DaskRunner: a ``dask.distributed`` cluster as a second distributed engine.

    scifolio build INPUT --out OUT --runner DaskRunner --dask_client_address tcp://127.0.0.1:8786

(``DaskRunner`` is this module's runner; a scheduler and workers started by ``dask scheduler`` /
``dask worker ADDRESS``, or a ``distributed.LocalCluster``.) Test: ``tests/pipelines/test_dask_runner.py``.

Beam 2.77's ``apache_beam.runners.dask.dask_runner.DaskRunner`` translates each transform into one Dask bag,
keyed by the transform that produced it (``DaskBagVisitor.visit_transform``: ``self.bags[input_value.producer]``),
and its ``ParDo`` drops the tags of tagged outputs (``transform_evaluator.apply_dofn_to_bundle`` returns
``v.value`` of every receiver's output): every output of a multi-output ``ParDo`` (``.with_outputs(...)``, and
``beam.Partition``, which is one) is one bag, the main output and each ``TaggedOutput`` mixed, so a consumer of the
"dropped" output also receives the documents. The corpus job routes dead letters through tagged outputs
everywhere, so this runner keeps each output's tag on its elements (``_TaggedParDo``) and hands a consumer of a
multi-output transform's PCollection only the elements of its tag (``_only``); the rest is Beam's translation.
Two other limits of Beam's DaskRunner remain and are named here rather than hidden:
- a side input is materialised inside the consuming task by computing its bag again
  (``transform_evaluator.DaskBagWindowedIterator.__iter__``: ``list(self.bag)``), so the stages upstream of the
  job's one side input (the count of finished documents that sizes the shards) run twice; the corpus job's
  stages are idempotent (content-addressed files, documents marked done), so the output is the same, and the
  cost is a second parse of every document;
- ``PipelineResult.metrics()`` is not implemented: the manifest's Beam counters are empty on this runner.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from apache_beam import DoFn, ParDo, TaggedOutput, pvalue
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, Receiver, _OutputHandler
from apache_beam.runners.dask import dask_runner as beam_dask
from apache_beam.runners.dask import transform_evaluator as evaluator
from apache_beam.runners.dask.transform_evaluator import DaskBagWindowedIterator, Flatten, NoOp
from apache_beam.transforms.sideinputs import SideInputMap


@dataclasses.dataclass
class _Receiver(Receiver):
    """Keeps each output with its tag: the main output's element bare, a tagged one as ``TaggedOutput``."""

    tag: str | None
    out: list[Any]

    def receive(self, windowed_value: Any) -> None:
        v = windowed_value.value
        self.out.append(v if self.tag is None else TaggedOutput(self.tag, v))


class _Receivers(dict):
    def __init__(self) -> None:
        super().__init__()
        self.out: list[Any] = []

    def __missing__(self, tag: str | None) -> _Receiver:
        self[tag] = _Receiver(tag, self.out)
        return self[tag]


def _run_bundle(items: Any, fn: Any, window_fn: Any, label: str, side_inputs: Any, args: Any, kwargs: Any) -> list:
    """One Dask partition through the DoFn (setup, bundle, teardown), as Beam's ``apply_dofn_to_bundle``, but
    with the outputs' tags kept."""
    receivers = _Receivers()
    handler = _OutputHandler(
        window_fn=window_fn,
        main_receivers=receivers[None],
        tagged_receivers=receivers,
        per_element_output_counter=None,
        output_batch_converter=None,
        process_yields_batches=False,
        process_batch_yields_elements=False,
    )
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn),
        handler,
        context=DoFnContext(label, state=None),
        side_inputs=side_inputs,
        input_args=args,
        input_kwargs=kwargs,
        user_state_context=None,
        bundle_finalizer_param=DoFn.BundleFinalizerParam(),
    )
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for it in items:
        invoker.invoke_process(it)
    invoker.invoke_finish_bundle()
    invoker.invoke_teardown()
    return receivers.out


class _TaggedParDo(evaluator.ParDo):
    def apply(self, input_bag: Any, side_inputs: Any = None) -> Any:
        transform = self.transform
        args, kwargs = transform.raw_side_inputs
        main = next(iter(self.applied.main_inputs.values()))
        window_fn = main.windowing.windowfn if hasattr(main, "windowing") else None
        return input_bag.map(evaluator.get_windowed_value, window_fn).map_partitions(
            _run_bundle, transform.fn, window_fn, transform.label, side_inputs, list(args), kwargs
        )


_TRANSLATIONS = {**evaluator.TRANSLATIONS, ParDo: _TaggedParDo}


def _only(items: list[Any], tag: str | None) -> list[Any]:
    """The elements of one output of a multi-output ParDo's bag: the main output's are the untagged ones."""
    if tag is None:
        return [x for x in items if not isinstance(x, TaggedOutput)]
    return [x.value for x in items if isinstance(x, TaggedOutput) and x.tag == tag]


class DaskRunner(beam_dask.DaskRunner):
    """Beam's DaskRunner whose consumers of a multi-output transform see their own output only (see above)."""

    @staticmethod
    def to_dask_bag_visitor(bag_kwargs: dict[str, Any] | None = None) -> PipelineVisitor:
        bag_kwargs = bag_kwargs or {}

        @dataclasses.dataclass
        class TaggedBagVisitor(PipelineVisitor):
            bags: dict[AppliedPTransform, Any] = dataclasses.field(default_factory=collections.OrderedDict)

            def bag_of(self, pcoll: pvalue.PValue) -> Any:
                producer = pcoll.producer
                bag = self.bags.get(producer)
                if bag is not None and len(producer.outputs) > 1:
                    bag = bag.map_partitions(_only, pcoll.tag)
                return bag

            def visit_transform(self, transform_node: AppliedPTransform) -> None:
                op = _TRANSLATIONS.get(transform_node.transform.__class__, NoOp)(transform_node, bag_kwargs=bag_kwargs)
                kws: dict[str, Any] = {"input_bag": None, "side_inputs": None}
                inputs = [self.bag_of(v) for v in transform_node.inputs if not isinstance(v, pvalue.PBegin)]
                inputs = [b for b in inputs if b is not None]
                if inputs:
                    kws["input_bag"] = inputs[0] if len(inputs) == 1 and not isinstance(op, Flatten) else inputs
                if transform_node.side_inputs:
                    kws["side_inputs"] = [
                        SideInputMap(
                            type(si),
                            si._view_options(),
                            DaskBagWindowedIterator(self.bag_of(si.pvalue), si._window_mapping_fn),
                        )
                        for si in transform_node.side_inputs
                    ]
                self.bags[transform_node] = op.apply(**kws)

        return TaggedBagVisitor()
