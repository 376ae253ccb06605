"""What the agents said on a pair: transcripts of graph-isomorphism episodes, and their pictures.

A transcript is one episode of :func:`nip_core.evaluation.evaluate_run`'s ``"pairs"`` mode
(the first episode on each pair), as plain data: the pair (both graphs' edges), its label and
WL score, every message in order (round, agent, graph, node) and how the verifier ended it.
:func:`render_transcript` draws one as a PNG: the two graphs side by side, nodes on a circle,
each node a message named with its rounds, coloured by the agent that sent it. They show
*which nodes a prover points at* on isomorphic and non-isomorphic pairs, not only that the
accuracy rose.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["episode_transcripts", "format_transcript", "render_transcript", "render_transcripts"]

DECISIONS = {0: "reject", 1: "accept"}


def episode_transcripts(batch, ends: torch.Tensor, first: torch.Tensor, protocol_handler, agent_names: list[str],
                        verifier_index: int, wl_scores: torch.Tensor, per_class: int) -> list[dict[str, Any]]:
    """The episodes of the first ``per_class`` pairs of each class: isomorphic pairs, then the
    non-isomorphic ones of each WL score (ascending; -1 last: not told apart).

    Parameters
    ----------
    batch
        The evaluation's collected steps, ``(pairs, steps)``, on the CPU.
    ends, first
        Bool ``(pairs, steps)``: the step that ends each pair's first episode, and the steps
        up to it.
    protocol_handler, agent_names, verifier_index
        Who is active in which round, and the agents' names.
    wl_scores
        The WL score of each pair of the dataset (-1: not told apart, as for isomorphic pairs).
    per_class
        How many pairs of each class, in the order of their datapoint ids.
    """
    max_nodes = batch["node_mask"].shape[-1]
    rows = sorted(range(batch.batch_size[0]), key=lambda i: int(batch["datapoint_id"][i, 0]))
    chosen: dict[tuple[int, int], list[int]] = {}
    for i in rows:
        score = int(wl_scores[int(batch["datapoint_id"][i, 0])])
        label = int(batch["y"][i, 0])
        # isomorphic first, then non-isomorphic by score with -1 (never told apart) last
        key = (0, 0) if label == 1 else (1, score if score >= 0 else 1 << 30)
        members = chosen.setdefault(key, [])
        if len(members) < per_class:
            members.append(i)
    transcripts = []
    for i in (i for key in sorted(chosen) for i in chosen[key]):
        steps = first[i].nonzero().squeeze(-1).tolist()
        end = int(ends[i].nonzero()[0, 0])
        rounds = batch["round"][i, steps]
        active = protocol_handler.get_active_agents_mask(rounds, batch["seed"][i, steps])  # (steps, A, C)
        selected = batch["agents", "node_selected"][i, steps]  # (steps, A, C, M)
        messages = []
        for s, round_ in enumerate(rounds.tolist()):
            for a, c in active[s].nonzero().tolist():
                for index in selected[s, a, c].tolist():
                    messages.append({"round": round_, "agent": agent_names[a], "channel": c,
                                     "graph": index // max_nodes, "node": index % max_nodes})
        terminated = bool(batch["next", "terminated"][i, end].any())
        decision = None if terminated else int(batch["agents", "decision"][i, end, verifier_index])
        mask = batch["node_mask"][i, 0]
        adjacency = batch["adjacency"][i, 0]
        graphs = []
        for g in range(2):
            n = int(mask[g].sum())
            upper = torch.triu(adjacency[g, :n, :n], 1).nonzero().tolist()
            graphs.append({"nodes": n, "edges": [tuple(e) for e in upper]})
        pair = int(batch["datapoint_id"][i, 0])
        y = int(batch["y"][i, 0])
        transcripts.append({"pair": pair, "y": y, "wl_score": int(wl_scores[pair]), "graphs": graphs,
                            "messages": messages, "decision": decision, "correct": decision == y})
    return transcripts


def format_transcript(transcript: dict[str, Any]) -> str:
    """One line: ``pair 3 (isomorphic, WL -1): r0 verifier G0:2 | r1 prover G1:5 | ... -> accept (correct)``."""
    kind = "isomorphic" if transcript["y"] == 1 else "not isomorphic"
    said = " | ".join(f"r{m['round']} {m['agent']} G{m['graph']}:{m['node']}" for m in transcript["messages"])
    decision = DECISIONS.get(transcript["decision"], "no decision (time-out)")
    verdict = "correct" if transcript["correct"] else "wrong"
    return f"pair {transcript['pair']} ({kind}, WL {transcript['wl_score']}): {said} -> {decision} ({verdict})"


def render_transcript(transcript: dict[str, Any], path: str | os.PathLike) -> None:
    """Draw ``transcript`` into the PNG ``path`` (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = sorted({m["agent"] for m in transcript["messages"]})
    colours = dict(zip(agents, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 3.8))
    for g, (ax, graph) in enumerate(zip(axes, transcript["graphs"])):
        n = graph["nodes"]
        xy = [(math.cos(2 * math.pi * k / n), math.sin(2 * math.pi * k / n)) for k in range(n)]
        for u, v in graph["edges"]:
            ax.plot([xy[u][0], xy[v][0]], [xy[u][1], xy[v][1]], color="0.75", lw=1, zorder=1)
        said = {}
        for m in transcript["messages"]:
            if m["graph"] == g:
                said.setdefault(m["node"], []).append(m)
        for k, (x, y) in enumerate(xy):
            sent = said.get(k, [])
            face = colours[sent[-1]["agent"]] if sent else "white"
            ax.scatter([x], [y], s=260, c=[face], edgecolors="black", zorder=2)
            ax.text(x, y, str(k), ha="center", va="center", fontsize=8, zorder=3)
            if sent:
                label = ",".join(f"r{m['round']}" for m in sent)
                ax.text(1.22 * x, 1.22 * y, label, ha="center", va="center", fontsize=7)
        ax.set_title(f"graph {g}", fontsize=9)
        ax.set_xlim(-1.5, 1.5)
        ax.set_ylim(-1.5, 1.5)
        ax.set_aspect("equal")
        ax.axis("off")
    kind = "isomorphic" if transcript["y"] == 1 else f"not isomorphic (WL score {transcript['wl_score']})"
    decision = DECISIONS.get(transcript["decision"], "time-out")
    fig.suptitle(f"pair {transcript['pair']}: {kind}; verifier: {decision} "
                 f"({'correct' if transcript['correct'] else 'wrong'})", fontsize=10)
    handles = [plt.Line2D([], [], marker="o", ls="", color=colours[a], label=a) for a in agents]
    fig.legend(handles=handles, loc="lower center", ncol=len(agents), fontsize=8, frameon=False)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def render_transcripts(transcripts: list[dict[str, Any]], directory: str | os.PathLike) -> list[Path]:
    """Draw each transcript as ``directory/pair_<id>.png`` (the directory is created); the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"pair_{t['pair']}.png" for t in transcripts]
    for transcript, path in zip(transcripts, paths):
        render_transcript(transcript, path)
    return paths
