"""Ray as the distributed engine of RL post-training (issue 12). The ONLY module of the project that imports Ray.

The work is done by plain classes (``HFEngine``/``VLLMEngine``, ``PartialRolloutScheduler``, ``Learner``); this
module only places them on a Ray cluster:

- ``EngineWorker``: an actor hosting one rollout engine, built ON the worker by a picklable factory (workers
  build heavy objects themselves; no model crosses the wire at start).
- ``RayEngine``: the ``RolloutEngine`` protocol over N engine workers, so the scheduler runs unchanged. Requests
  go to the worker with the most free slots; ``step`` steps every busy worker in parallel; ``pause`` pauses them
  all; a weight update is put in the object store once and every worker reads it from there. Finished and
  paused trajectories come back in admission order, so with per-worker capacity summing to an in-process
  engine's capacity the scheduler sees the same sequence of events as in-process.
  Over ``SpeculativeEngine`` workers (``engine.kind=speculative``) it also syncs the draft (``update_draft``,
  object store once, like the policy) and combines the speculative statistics: counters summed, the
  verification log merged per step into the groups one engine would have batched (``take_round_log``), so the
  online draft trainer in the driver sees what it sees in-process.
- ``init_ray("local" | ADDRESS)`` / ``ensure_ray``: start a local Ray in this process or join a cluster.

The driver stays in the caller's process (``posttrain.rl.loop.run_stage``): ``scifolio posttrain rl --ray local``
(``engine.ray``) starts ``engine.workers`` engine actors from the run's ``posttrain.rl.engines.EngineFactory``
behind one ``RayEngine``; the learner and, for speculative engines, the draft trainer stay with the driver. On
Kubernetes see ``infra/ray/README.md``. Ray binds every interface: run tests and local
clusters in a loopback-only namespace.

    unshare -n sh -c 'ip link set lo up && exec env PYTHONPATH=$PWD python -m pytest tests/posttrain/test_ray_actors.py'
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from posttrain.rollout.engine import RolloutEngine, StepOutput
from posttrain.rollout.types import Request, Trajectory

EngineFactory = Callable[[], RolloutEngine]
"""Builds one rollout engine on the worker that calls it (a module-level function or a picklable callable)."""


def init_ray(address: str = "local", num_cpus: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """``"local"``: start a Ray head inside this process (no dashboard, no usage stats); else join ``address``
    (``HOST:PORT`` of a head's GCS, ``auto`` inside a cluster, or ``ray://HOST:10001`` through Ray Client).

    A local Ray's workers get this checkout on their ``PYTHONPATH``; a cluster's image installs the project.
    Returns the cluster's resources.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address == "local":
        root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        runtime_env = {"env_vars": {"PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0"}}
        ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env, **kwargs)
    else:
        ray.init(address=address, **kwargs)
    return ray.cluster_resources()


def shutdown_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()


class _EngineHost:
    """One rollout engine living in a Ray worker process; ``call(method, *args)`` runs one of its methods there."""

    def __init__(self, factory: EngineFactory, torch_threads: int = 1) -> None:
        import torch

        torch.set_num_threads(torch_threads)
        self.engine = factory()

    def info(self) -> tuple[int, int, int, str, bool]:
        e = self.engine
        node = ray.get_runtime_context().get_node_id()
        return e.version, e.capacity, e.n_active, node, hasattr(e, "update_draft")

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.engine, method)(*args)

    def step_rounds(self) -> tuple[StepOutput, list[tuple[tuple[int, int], tuple[str, ...], list[int]]]]:
        """A speculative engine's step plus the verification rounds it logged: (KV lengths, ids, n_accepted)."""
        out = self.engine.step()
        groups = self.engine.round_groups
        log = self.engine.take_round_log()
        return out, [(key, ids, n.tolist()) for (key, ids), n in zip(groups, log, strict=True)]

    def spec_stats(self) -> dict[str, int]:
        """A speculative engine's cumulative counters and the draft version it holds."""
        names = ("rounds", "proposed", "reached", "accepted", "emitted", "draft_version")
        return {n: int(getattr(self.engine, n)) for n in names}


EngineWorker = ray.remote(_EngineHost)
"""``EngineWorker.options(num_cpus=1).remote(factory)``: an engine in its own Ray worker process."""


def start_engine_workers(
    factory: EngineFactory, n_workers: int, num_cpus: float = 1, spread: bool = True, torch_threads: int = 1
) -> list[Any]:
    """``n_workers`` engine actors (``SPREAD`` over nodes by default), each building its engine with ``factory``."""
    strategy = "SPREAD" if spread else "DEFAULT"
    return [
        EngineWorker.options(num_cpus=num_cpus, scheduling_strategy=strategy).remote(factory, torch_threads)
        for _ in range(n_workers)
    ]


class RayEngine:
    """``RolloutEngine`` over engine-worker actors (see the module docstring)."""

    def __init__(self, workers: Sequence[Any]) -> None:
        if not workers:
            raise ValueError("RayEngine needs at least one engine worker")
        self.workers = list(workers)
        versions, caps, active, nodes, kinds = zip(*ray.get([w.info.remote() for w in self.workers]))
        if len(set(versions)) != 1:
            raise ValueError(f"engine workers start at different versions: {sorted(set(versions))}")
        if any(active):
            raise ValueError("engine workers must start empty")
        if len(set(kinds)) != 1:
            raise ValueError("engine workers mix speculative and plain engines")
        self.speculative = kinds[0]
        """The workers host ``SpeculativeEngine``s: ``update_draft`` and the speculative statistics work."""
        self._version = versions[0]
        self._caps = list(caps)
        self.nodes = list(nodes)
        """Ray node id of each worker (tests check the workers really sit on different nodes)."""
        self._round_log: list[Any] = []
        self._held: list[set[str]] = [set() for _ in self.workers]
        self._admitted: dict[str, int] = {}
        self._counter = 0
        self.steps = 0

    # -- protocol properties ------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def capacity(self) -> int:
        return sum(self._caps)

    @property
    def n_active(self) -> int:
        return sum(len(h) for h in self._held)

    # -- protocol methods ---------------------------------------------------------------------------------------
    def submit(self, requests: Sequence[Request]) -> None:
        self._place(list(requests), "submit")

    def resume(self, trajectories: Sequence[Trajectory]) -> None:
        self._place(list(trajectories), "resume")

    def step(self) -> StepOutput:
        busy = [i for i, h in enumerate(self._held) if h]
        if self.speculative:
            results = ray.get([self.workers[i].step_rounds.remote() for i in busy])
            outs = [o for o, _ in results]
            self._merge_rounds([r for _, rounds in results for r in rounds])
        else:
            outs = ray.get([self.workers[i].call.remote("step") for i in busy])
        merged = StepOutput()
        for i, o in zip(busy, outs, strict=True):
            merged.n_decoded += o.n_decoded
            merged.n_prefilled_tokens += o.n_prefilled_tokens
            merged.new_tokens.update(o.new_tokens)  # request ids are unique across workers
            self._held[i].difference_update(t.request_id for t in o.finished)
            merged.finished += o.finished
        merged.finished.sort(key=self._order)
        for t in merged.finished:
            self._admitted.pop(t.request_id, None)
        self.steps += 1
        return merged

    def pause(self) -> list[Trajectory]:
        outs = ray.get([w.call.remote("pause") for w in self.workers])
        paused = sorted((t for out in outs for t in out), key=self._order)
        self._held = [set() for _ in self.workers]
        self._admitted.clear()
        return paused

    def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        ids = set(request_ids)
        calls = [(i, sorted(h & ids)) for i, h in enumerate(self._held) if h & ids]
        outs = ray.get([self.workers[i].call.remote("abort", sub) for i, sub in calls])
        aborted = sorted((t for out in outs for t in out), key=self._order)
        for i, sub in calls:
            self._held[i].difference_update(sub)
            for rid in sub:
                self._admitted.pop(rid, None)
        return aborted

    def update_weights(self, state: Mapping[str, Any] | ray.ObjectRef, version: int) -> None:
        """Put the weights in the object store once (or take a ref already there); every worker loads them."""
        self._broadcast("update_weights", state, version)
        self._version = int(version)

    # -- speculative workers -------------------------------------------------------------------------------------
    def update_draft(self, state: Mapping[str, Any] | ray.ObjectRef, version: int) -> None:
        """The draft's weights, sent as ``update_weights`` sends the policy's."""
        self._need_speculative("update_draft")
        self._broadcast("update_draft", state, version)

    def take_round_log(self) -> list[Any]:
        """The merged verification outcomes since the last call (``n_accepted`` tensors, one per batched group)."""
        self._need_speculative("take_round_log")
        log, self._round_log = self._round_log, []
        return log

    def spec_stats(self) -> dict[str, int]:
        """The workers' counters summed; ``draft_version`` is the one version every worker holds (raises if not)."""
        self._need_speculative("spec_stats")
        stats = ray.get([w.spec_stats.remote() for w in self.workers])
        drafts = {s["draft_version"] for s in stats}
        if len(drafts) != 1:
            raise RuntimeError(f"engine workers hold different draft versions: {sorted(drafts)}")
        total = {k: sum(s[k] for s in stats) for k in stats[0] if k != "draft_version"}
        return {**total, "draft_version": drafts.pop()}

    @property
    def acceptance(self) -> float:
        """Per-position acceptance over all workers: accepted / tested draft tokens (as ``SpeculativeEngine``)."""
        s = self.spec_stats()
        return s["accepted"] / max(1, s["reached"])

    @property
    def emitted(self) -> int:
        return self.spec_stats()["emitted"]

    @property
    def rounds(self) -> int:
        return self.spec_stats()["rounds"]

    @property
    def draft_version(self) -> int:
        return self.spec_stats()["draft_version"]

    def _need_speculative(self, what: str) -> None:
        if not self.speculative:
            raise RuntimeError(f"{what}: the engine workers are not speculative (engine.kind=speculative)")

    def _merge_rounds(self, rounds: list[tuple[tuple[int, int], tuple[str, ...], list[int]]]) -> None:
        """One step's rounds from every worker → the groups one ``SpeculativeEngine`` holding all these requests
        would have batched: same group key (draft lag, K) → one group; groups ordered by their earliest-admitted request (one
        engine groups its running requests, kept in admission order, by first occurrence); members likewise.
        ``AcceptanceTracker`` folds one EMA update per group, so the grouping, not just the counts, must match."""
        import torch

        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for key, ids, n_acc in rounds:
            groups.setdefault(key, []).extend(zip((self._order_id(r) for r in ids), n_acc, strict=True))
        for members in sorted(groups.values(), key=min):
            self._round_log.append(torch.tensor([n for _, n in sorted(members)]))

    # -- internals ----------------------------------------------------------------------------------------------
    def _order_id(self, request_id: str) -> int:
        return self._admitted.get(request_id, 1 << 62)

    def _order(self, t: Trajectory) -> int:
        return self._order_id(t.request_id)

    def _broadcast(self, method: str, state: Mapping[str, Any] | ray.ObjectRef, version: int) -> None:
        if self.n_active:
            raise RuntimeError(f"{method} while requests are held: pause() first")
        ref = state if isinstance(state, ray.ObjectRef) else ray.put(dict(state))
        ray.get([w.call.remote(method, ref, int(version)) for w in self.workers])

    def _place(self, items: list[Request] | list[Trajectory], method: str) -> None:
        """Give each item to the worker with the most free slots (lowest index on ties), in order."""
        batches: list[list] = [[] for _ in self.workers]
        for item in items:
            rid = item.request_id
            i = max(range(len(self.workers)), key=lambda w: (self._caps[w] - len(self._held[w]), -w))
            self._held[i].add(rid)
            self._admitted[rid] = self._counter
            self._counter += 1
            batches[i].append(item)
        ray.get([self.workers[i].call.remote(method, b) for i, b in enumerate(batches) if b])


def ensure_ray(address: str, n_workers: int) -> None:
    """Start a local Ray (``local``: one CPU per engine worker) or join ``HOST:PORT``, unless already connected."""
    if not ray.is_initialized():
        init_ray(address, num_cpus=n_workers if address == "local" else None)
