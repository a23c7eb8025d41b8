"""The trace store: one incremental PrefixTree per session tree, persisted in SQLite (SPEC §C6).

A node is either a *context* delta (text and ids the gateway encoded; never trained on) or an assistant
*response*: the engine's ``Trajectory`` exactly as it returned it (``Node.trajectory``), trained on unless marked
``skip``. A model call = a path root → … → context delta → response; its input ids are the path's ids, exactly as
fed to the engine (checked), never re-tokenised. ``session_export`` and ``session_trajectory`` read a session's path.

Trees: the API key ``GROUP:ROLLOUT`` puts the rollouts of one group in one tree (they share the header and any
common turns, SPEC §C6); a key without ``:`` is its own tree. Longest-prefix matching walks the tree by node *text*
so a re-rendered history reuses the stored ids. If a session's new request does not extend the text of its own
previous call (the harness re-rendered its history differently), the store branches at the longest still-matching
node and records a FORK with where and why; the old branch stays. Everything is written to SQLite on each call
(WAL), so a crashed run keeps its traces; ``TraceStore(path)`` reloads them.

    store = TraceStore("traces.sqlite"); store.session_export("g:0")

Tests: ``pytest tests/posttrain/agentic/test_traces.py``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.agentic.images import MARKER
from posttrain.rollout.types import Request, Trajectory

CONTEXT, RESPONSE = "context", "response"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (id INTEGER PRIMARY KEY, tree TEXT, parent INTEGER, kind TEXT, text TEXT,
  token_ids TEXT, logprobs TEXT, versions TEXT, experts TEXT, skip INTEGER DEFAULT 0, session TEXT, trajectory TEXT);
CREATE TABLE IF NOT EXISTS calls (id TEXT PRIMARY KEY, seq INTEGER, session TEXT, tree TEXT, context_node INTEGER,
  response_node INTEGER, prompt_len INTEGER, output_len INTEGER, finish TEXT, protocol TEXT, meta TEXT);
CREATE TABLE IF NOT EXISTS forks (id INTEGER PRIMARY KEY, session TEXT, tree TEXT, call_id TEXT, at_node INTEGER,
  offset INTEGER, stored TEXT, rendered TEXT);
"""


@dataclass
class Node:
    id: int
    tree: str
    parent: int | None
    kind: str
    text: str
    """The text ``token_ids`` decode to (prefix matching walks it)."""
    token_ids: list[int]
    """A context delta's ids; a response's are its trajectory's (the same list)."""
    trajectory: Trajectory | None = None
    """A response: the engine's ``Trajectory`` as returned (None for a context delta)."""
    skip: bool = False
    session: str = ""
    children: list[int] = field(default_factory=list)

    @property
    def logprobs(self) -> list[float]:
        return self.trajectory.logprobs if self.trajectory is not None else []

    @property
    def versions(self) -> list[int]:
        return self.trajectory.versions if self.trajectory is not None else []

    @property
    def experts(self) -> Any:
        return self.trajectory.routed_experts if self.trajectory is not None else None


@dataclass
class Match:
    """Where a rendered prompt meets the tree."""

    node: int | None
    """Deepest fully matched node (None = the tree's root)."""
    offset: int
    """Characters of the rendered text covered by the matched path."""
    path_ids: list[int]
    fork: dict[str, Any] | None = None
    """Set when the session's previous call is not a prefix of this request."""


def tree_of(session: str) -> str:
    return session.split(":", 1)[0]


class TraceStore:
    """In-memory trees mirrored to SQLite (``path`` None = in memory only)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.nodes: dict[int, Node] = {}
        self.roots: dict[str, list[int]] = {}
        self.calls: dict[str, dict[str, Any]] = {}
        self.session_calls: dict[str, list[str]] = {}
        self.forks: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.db = sqlite3.connect(str(path) if path else ":memory:", check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a commit survives a crash of this process (the run), not a power cut; no fsync per call
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        if "trajectory" not in {r[1] for r in self.db.execute("PRAGMA table_info(nodes)")}:  # a store from before
            self.db.execute("ALTER TABLE nodes ADD COLUMN trajectory TEXT")
        self._load()

    # -- persistence ---------------------------------------------------------------------------------
    def _load(self) -> None:
        for row in self.db.execute(
            "SELECT id,tree,parent,kind,text,token_ids,logprobs,versions,experts,skip,session,trajectory "
            "FROM nodes ORDER BY id"
        ):
            n = Node(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), skip=bool(row[9]), session=row[10])
            if n.kind == RESPONSE:
                n.trajectory = _trajectory_of(row, self.path_ids(n.parent))
                n.token_ids = n.trajectory.token_ids
            self._attach(n)
        for row in self.db.execute(
            "SELECT id,session,tree,context_node,response_node,prompt_len,output_len,finish,protocol,meta "
            "FROM calls ORDER BY seq"
        ):
            keys = ("id", "session", "tree", "context_node", "response_node", "prompt_len", "output_len", "finish")
            c = dict(zip(keys, row[:8]), protocol=row[8], meta=json.loads(row[9]))
            self.calls[c["id"]] = c
            self.session_calls.setdefault(c["session"], []).append(c["id"])
        for row in self.db.execute("SELECT session,tree,call_id,at_node,offset,stored,rendered FROM forks ORDER BY id"):
            self.forks.append(dict(zip(("session", "tree", "call_id", "at_node", "offset", "stored", "rendered"), row)))

    def _attach(self, n: Node) -> None:
        self.nodes[n.id] = n
        if n.parent is None:
            self.roots.setdefault(n.tree, []).append(n.id)
        else:
            self.nodes[n.parent].children.append(n.id)

    def _insert(self, n: Node) -> None:
        rest = None
        if n.trajectory is not None:  # the per-token fields have their columns; the prompt is the node's path
            rest = n.trajectory.to_dict()
            for k in ("token_ids", "logprobs", "versions", "routed_experts"):
                del rest[k]
            rest["request"]["prompt_ids"] = []
        row = dict(tree=n.tree, parent=n.parent, kind=n.kind, text=n.text, skip=int(n.skip), session=n.session)
        for k in ("token_ids", "logprobs", "versions", "experts"):
            row[k] = json.dumps(getattr(n, k))
        n.id = self._write("nodes", {**row, "trajectory": rest and json.dumps(rest)})
        self._attach(n)

    def _write(self, table: str, row: dict[str, Any]) -> int:
        """Insert ``row`` (column → value) into ``table``; returns its rowid."""
        sql = f"INSERT INTO {table} ({','.join(row)}) VALUES ({','.join('?' * len(row))})"
        return int(self.db.execute(sql, tuple(row.values())).lastrowid)

    # -- tree walking --------------------------------------------------------------------------------
    def children(self, tree: str, node: int | None) -> list[Node]:
        ids = self.roots.get(tree, []) if node is None else self.nodes[node].children
        return [self.nodes[i] for i in ids]

    def path(self, node: int | None) -> list[Node]:
        out = []
        while node is not None:
            out.append(self.nodes[node])
            node = self.nodes[node].parent
        return out[::-1]

    def path_ids(self, node: int | None) -> list[int]:
        return [t for n in self.path(node) for t in n.token_ids]

    def match_text(self, session: str, text: str) -> Match:
        """Longest stored path of ``session``'s tree whose text is a prefix of ``text``."""
        tree = tree_of(session)
        node, pos = None, 0
        while True:
            best = None
            for c in self.children(tree, node):
                if c.text and text.startswith(c.text, pos) and (best is None or len(c.text) > len(best.text)):
                    best = c
            if best is None:
                break
            node, pos = best.id, pos + len(best.text)
        m = Match(node, pos, self.path_ids(node))
        prev = self.session_calls.get(session)
        if prev:
            last = self.calls[prev[-1]]["response_node"]
            stored = "".join(n.text for n in self.path(last))
            if not text.startswith(stored):
                at = next((i for i, (a, b) in enumerate(zip(stored, text)) if a != b), min(len(stored), len(text)))
                m.fork = {
                    "session": session,
                    "tree": tree,
                    "at_node": node,
                    "offset": at,
                    "stored": stored[at : at + 80],
                    "rendered": text[at : at + 80],
                }
        return m

    def match_tokens(self, tree: str, segments: list[tuple[str, list[int]]]) -> tuple[int | None, int]:
        """Token-level longest prefix: how many leading (kind, ids) segments already exist; returns (node, k)."""
        node, k = None, 0
        for kind, ids in segments:
            hit = next((c for c in self.children(tree, node) if c.kind == kind and c.token_ids == ids), None)
            if hit is None:
                break
            node, k = hit.id, k + 1
        return node, k

    # -- writing -------------------------------------------------------------------------------------
    def record_call(
        self,
        call_id: str,
        session: str,
        parent: int | None,
        context: tuple[str, list[int]],
        text: str,
        trajectory: Trajectory,
        finish: str,
        protocol: str = "",
        meta: dict[str, Any] | None = None,
        fork: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Write one model call: the context delta after ``parent`` (reused if identical) and the response.

        context: (text, ids) the gateway encoded; ``trajectory``: the engine's, kept as it is, whose prompt must be
        the path's ids + the context ids; ``text``: what its ids decode to.
        """
        tree = tree_of(session)
        with self._lock:
            prompt = self.path_ids(parent) + list(context[1])
            if list(trajectory.prompt_ids) != prompt:
                raise ValueError(f"{call_id}: the trajectory's prompt is not the stored path + context ids")
            ctx_node = parent
            if context[1]:
                key = (CONTEXT, *context)  # the text too: two images' placeholder ids are equal, their keyed texts not
                hit = next((c for c in self.children(tree, parent) if (c.kind, c.text, c.token_ids) == key), None)
                if hit is None:
                    hit = Node(0, tree, parent, CONTEXT, context[0], list(context[1]), session=session)
                    self._insert(hit)
                ctx_node = hit.id
            ids = trajectory.token_ids
            same = [c for c in self.children(tree, ctx_node) if c.kind == RESPONSE and c.token_ids == ids]
            # an identical sample (same ids, same versions) after the same context is one node
            resp = next((c for c in same if c.versions == trajectory.versions), None)
            if resp is None:
                resp = Node(0, tree, ctx_node, RESPONSE, text, ids, trajectory, session=session)
                self._insert(resp)
            meta = dict(meta or {})
            c = dict(id=call_id, session=session, tree=tree, context_node=ctx_node, response_node=resp.id)
            c.update(prompt_len=len(prompt), output_len=len(ids), finish=finish, protocol=protocol, meta=meta)
            self._write("calls", {**c, "seq": len(self.calls), "meta": json.dumps(meta)})
            if fork is not None:
                fork = {**fork, "call_id": call_id}
                self.forks.append(fork)
                self._write("forks", fork)
            self.db.commit()
            self.calls[call_id] = c
            self.session_calls.setdefault(session, []).append(call_id)
            return c

    def mark_skip(self, call_id: str, skip: bool = True) -> None:
        """Keep the call's response in context but exclude it from the loss."""
        node = self.nodes[self.calls[call_id]["response_node"]]
        node.skip = skip
        self.db.execute("UPDATE nodes SET skip=? WHERE id=?", (int(skip), node.id))
        self.db.commit()

    # -- reading -------------------------------------------------------------------------------------
    def call_input_ids(self, call_id: str) -> list[int]:
        return self.path_ids(self.calls[call_id]["context_node"])

    def call_output_ids(self, call_id: str) -> list[int]:
        return list(self.nodes[self.calls[call_id]["response_node"]].token_ids)

    def stored_tokens(self, tree: str | None = None) -> int:
        """Tokens held by the tree(s): every node once."""
        return sum(len(n.token_ids) for n in self.nodes.values() if tree is None or n.tree == tree)

    def flat_tokens(self, tree: str | None = None) -> int:
        """Tokens a flat log would hold: each call's full input + output."""
        return sum(c["prompt_len"] + c["output_len"] for c in self.calls.values() if tree is None or c["tree"] == tree)

    def session_export(self, session: str) -> dict[str, Any]:
        """The session's final path (its last call) as plain per-token arrays.

        ``token_ids``, ``loss_mask`` (1 on non-skipped response tokens), ``labels`` (id or −100),
        ``logprobs`` (0 on context), ``versions`` (a context token takes the version of the response
        before it, 0 at the start), ``segment_ids`` (index k of the trainable response segment, −1
        elsewhere), ``spans`` (per call on the path: [start, end) of its response tokens), ``calls``, ``images`` (the
        content hashes of the path's images, in order: references, the store keeps no pixels).
        Earlier branches left by a FORK stay in the store but are not part of this export.
        """
        last = self.calls[self.session_calls[session][-1]]
        out = {k: [] for k in ("token_ids", "loss_mask", "labels", "logprobs", "versions", "segment_ids")}
        spans, calls, v, k = [], [], 0, 0
        by_resp = {self.calls[cid]["response_node"]: cid for cid in self.session_calls[session]}
        for n in self.path(last["response_node"]):
            start, size, resp = len(out["token_ids"]), len(n.token_ids), n.kind == RESPONSE
            train = resp and not n.skip
            out["token_ids"] += n.token_ids
            out["loss_mask"] += [int(train)] * size
            out["labels"] += list(n.token_ids) if train else [-100] * size
            out["logprobs"] += n.logprobs if resp else [0.0] * size
            out["versions"] += n.versions if resp else [v] * size
            out["segment_ids"] += [k if train else -1] * size
            k += int(train)
            if resp:
                v = n.versions[-1] if n.versions else v
                spans.append((start, len(out["token_ids"])))
                calls.append(by_resp.get(n.id))
        images = [h for n in self.path(last["response_node"]) for h in MARKER.findall(n.text) if n.kind == CONTEXT]
        return {**out, "spans": spans, "calls": calls, "n_segments": k, "images": images}

    def session_trajectory(self, session: str, reward: float, export: dict[str, Any] | None = None) -> Trajectory:
        """The session's exported path as one learner ``Trajectory``: prompt = the tokens before its first response,
        then every later token (responses trained on unless skipped, context between them masked). MoE (R3): the
        routes of the session's last call, whose prompt was the whole path before its response (every earlier
        token routed at the session's version). ``export``: the session's ``session_export`` when the caller has it."""
        ex = export if export is not None else self.session_export(session)
        start = ex["spans"][0][0]
        req = Request(session, ex["token_ids"][:start], group_id=tree_of(session))
        experts = self.nodes[self.calls[self.session_calls[session][-1]]["response_node"]].experts
        per_token = (ex[k][start:] for k in ("token_ids", "logprobs", "versions", "loss_mask"))
        t = Trajectory(req, *per_token, routed_experts=experts, finish_reason="stop", reward=reward)
        t.validate()
        return t

    def close(self) -> None:
        self.db.close()


def _trajectory_of(row: tuple, prompt_ids: list[int]) -> Trajectory:
    """A response node's ``Trajectory`` from its row (``_insert``); rows written before the ``trajectory`` column
    get one with the per-token fields only."""
    ids, lps, vers, experts = (json.loads(row[i]) for i in (5, 6, 7, 8))
    if row[11] is None:
        return Trajectory(Request("", prompt_ids), ids, lps, vers, [1] * len(ids), experts)
    d = json.loads(row[11])
    d["request"]["prompt_ids"] = prompt_ids
    return Trajectory.from_dict({**d, "token_ids": ids, "logprobs": lps, "versions": vers, "routed_experts": experts})
