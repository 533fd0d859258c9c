"""EAGLE-2 dynamic draft trees: one target forward verifies many alternative continuations.

A chain spends the whole verification on one guess per position, so a single wrong token ends
the round. A tree spends it on the continuations the head itself finds most likely. Drafting
(Li et al. 2024, EAGLE-2): from the root (the last committed token) each level scores the top-k
children of every frontier node by cumulative draft log-probability, and the next frontier is the
top-k of those; then all drafted nodes are reranked by that score and the best `tokens` kept.
A child's score never exceeds its parent's (log-probabilities are ≤ 0, ties go to the shallower
node), so the kept set is always a tree. The target verifies it in one forward, each node
attending to the committed prefix and its own ancestors (4D mask, position = prefix + depth);
the accepted path is the longest walk from the root along children the target agrees with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tasks.decode.sampling import draw
from tasks.decode.stopwatch import NO_STOPWATCH
from tasks.decode.target_choices import TargetChoices
from tasks.decode.tree_shape import TreeShape


@dataclass
class DraftTree:
    """Drafted nodes, parents before children and siblings best first. Node i holds target token
    `tokens[i]` at `depths[i]` (1 = a child of the root) below node `parents[i]` (−1 = the root)."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]

    @classmethod
    def from_chains(cls, chains: list[list[int]]) -> DraftTree:
        """Chains drafted side by side as one tree: a prefix they share is verified once, then
        each goes its own way (the first chain's node first among siblings)."""
        tree = cls([], [], [])
        for chain in chains:
            node = -1
            for depth, token in enumerate(chain, start=1):
                shared = next((c for c in tree.children(node) if tree.tokens[c] == token), None)
                node = tree._add(token, node, depth) if shared is None else shared
        return tree

    def _add(self, token: int, parent: int, depth: int) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(depth)
        return len(self.tokens) - 1

    def is_chain(self) -> bool:
        """Every node the child of the one before: verified causally, no tree mask needed."""
        return self.parents == list(range(-1, len(self.tokens) - 1))

    def children(self, node: int) -> list[int]:
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def visible(self) -> torch.Tensor:
        """(1+n, 1+n) bool: row r (0 = root, 1+i = node i) sees itself and its ancestors."""
        seen = torch.eye(1 + len(self.tokens), dtype=torch.bool)
        seen[:, 0] = True
        for i, parent in enumerate(self.parents):
            seen[1 + i] |= seen[1 + parent]
        return seen


@torch.no_grad()
def draft_tree(drafter, depth: int, shape: TreeShape) -> DraftTree:
    """EAGLE-2 drafting with the head of a `HeadDrafter`, whose cache is left as it was.

    Every frontier node is one batch row whose KV cache is the committed pairs followed by its own
    ancestors' pairs, so the head's plain causal decode attends exactly to the committed prefix and
    the node's ancestors: a tree attention mask without a mask."""
    head, targets = drafter.head, drafter.targets
    hidden, past = drafter.hidden, drafter.past  # the root: one row
    log_probs = torch.log_softmax(head.logits(hidden)[:, -1].float(), dim=-1)
    frontier_scores, frontier_nodes = torch.zeros(1, device=log_probs.device), [-1]
    scores, tokens, parents, depths = [], [], [], []
    for level in range(depth):
        top = (frontier_scores[:, None] + log_probs).topk(min(shape.topk, log_probs.shape[-1]), dim=-1)
        per_node, first = top.values.shape[1], len(tokens)
        values, ids = top.values.flatten(), targets[top.indices.flatten()]
        scores, tokens, depths = scores + values.tolist(), tokens + ids.tolist(), depths + [level + 1] * len(ids)
        parents += [node for node in frontier_nodes for _ in range(per_node)]
        if level + 1 == depth:
            break
        best = values.topk(min(shape.topk, len(values))).indices
        rows = best // per_node  # the row of each new frontier node's parent
        frontier_scores, frontier_nodes = values[best], (first + best).tolist()
        positions = torch.full((len(best), 1), drafter.length + level, device=log_probs.device)
        hidden, past = head.decode(hidden[rows], ids[best][:, None], positions, (past[0][rows], past[1][rows]))
        log_probs = torch.log_softmax(head.logits(hidden)[:, -1].float(), dim=-1)
    return _keep_best(scores, tokens, parents, depths, shape.tokens)


def _keep_best(scores, tokens, parents, depths, size: int) -> DraftTree:
    """The `size` best nodes by cumulative score (ties: shallower first, so parents before
    children), renumbered level by level, siblings best first."""
    ranked = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i]))[:size]
    kept = sorted(ranked, key=lambda i: (depths[i], -scores[i]))
    index = {old: new for new, old in enumerate(kept)} | {-1: -1}
    return DraftTree([tokens[i] for i in kept], [index[parents[i]] for i in kept], [depths[i] for i in kept])


def tree_mask(tree: DraftTree, prefix: int, dtype: torch.dtype, device: torch.device | str = "cpu",
              window: int | None = None) -> torch.Tensor:
    """(1, 1, 1+n, prefix+1+n) additive mask for the target: the committed prefix and each row's
    ancestors are visible (0), the rest masked (the dtype's minimum). Additive works for both the
    eager and the SDPA attention of Hugging Face models, which take a 4D mask as it is. With
    `window`, a sliding-window layer's: keys `window` or more positions behind a row's are masked too."""
    seen = torch.cat([torch.ones(1 + len(tree.tokens), prefix, dtype=torch.bool), tree.visible()], dim=1)
    if window is not None:
        rows = prefix + torch.tensor([0, *tree.depths])
        seen &= torch.cat([torch.arange(prefix), rows])[None, :] > rows[:, None] - window
    return torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)[None, None].to(device)


def tree_masks(config, tree: DraftTree, prefix: int, dtype: torch.dtype, device: torch.device | str):
    """The target's mask for a tree forward: one mask, or for a model with sliding-window layers
    (Gemma-3) one per layer type, as such a model takes them."""
    if "sliding_attention" not in (getattr(config, "layer_types", None) or ()):
        return tree_mask(tree, prefix, dtype, device)
    return {"full_attention": tree_mask(tree, prefix, dtype, device),
            "sliding_attention": tree_mask(tree, prefix, dtype, device, window=config.sliding_window)}


def walk_greedy(tree: DraftTree, lm_head, hidden: torch.Tensor) -> tuple[list[int], int]:
    """Follow the children equal to the target's argmax at their parent; at the first node with
    none, the target's argmax there is the bonus token. Returns (accepted nodes, bonus). The
    target's logits come from its final hidden states (1+n, H), in float32 on a CPU one row at a
    time along the walk (most rows of a tree are never reached), else all in one product
    (tasks/decode/target_choices.py)."""
    choices = TargetChoices(lm_head, hidden)
    path, node = [], -1
    while True:
        choice = choices[1 + node]
        child = next((c for c in tree.children(node) if tree.tokens[c] == choice), None)
        if child is None:
            return path, choice
        path.append(child)
        node = child


def walk_sampled(tree: DraftTree, probs: torch.Tensor, generator=None) -> tuple[list[int], int]:
    """Lossless sampling over a tree of deterministic drafts. At a node with target distribution
    p, try its children in turn: accept child c with probability p(c) (renormalised over what is
    left), else drop c from p; if none is accepted, sample from what is left of p. Child j is
    emitted with probability Π_{i<j}(1 − p_i) · p_j / (1 − Σ_{i<j} p_i) = p_j, any other token
    with (1 − Σ p_children) · p(x) / (1 − Σ p_children) = p(x): exactly the target's p."""
    path, node = [], -1
    while True:
        p = probs[1 + node].clone()
        for child in tree.children(node):
            if float(torch.rand((), generator=generator)) * float(p.sum()) < float(p[tree.tokens[child]]):
                break
            p[tree.tokens[child]] = 0
        else:
            return path, draw(p, generator)
        path.append(child)
        node = child


def keep_positions(cache, keep: torch.Tensor) -> None:
    """Keep only sequence positions `keep` of every layer of a Hugging Face DynamicCache (keys and
    values (batch, heads, seq, head_dim)): the accepted tree nodes are not contiguous."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.index_select(-2, keep), layer.values.index_select(-2, keep)


@torch.no_grad()
def verify_tree(target, cache, tree: DraftTree, last: int, logits: bool = True):
    """One target forward over the root `last` and every tree node, each attending to the cached
    prefix and its own ancestors at position prefix + depth; the cache then holds all of them.
    Without `logits`, the target's body alone (its final hidden states, for `walk_greedy`). A
    chain needs no mask: the plain causal forward, as a chain round runs it."""
    prefix, device = cache.get_seq_length(), target.device
    forward = target if logits else target.get_decoder()
    layout = {} if tree.is_chain() else {
        "attention_mask": tree_masks(target.config, tree, prefix, target.dtype, device),
        "position_ids": prefix + torch.tensor([[0, *tree.depths]], device=device)}
    return forward(input_ids=torch.tensor([[last, *tree.tokens]], device=device), cache=cache,
                   output_hidden_states=True, use_cache=True, **layout)


@torch.no_grad()
def tree_round(target, cache, drafter, last: int, depth: int, shape: TreeShape, temperature: float = 0.0,
               generator=None, stopwatch=NO_STOPWATCH):
    """One round: draft a tree after `last`, verify it, keep the accepted path in the target's
    cache. Returns (emitted tokens, the forward's hidden_states, the rows of them that pair with
    the emitted tokens: the root and the accepted nodes)."""
    tree = drafter.propose_tree(depth, shape)  # timed by the drafter, part by part
    prefix = cache.get_seq_length()
    greedy = temperature == 0
    with stopwatch.part("verify: target layers"):
        out = verify_tree(target, cache, tree, last, logits=not greedy)
    with stopwatch.part("target lm_head and accept"):
        path, bonus = (walk_greedy(tree, target.get_output_embeddings(), out.last_hidden_state[0]) if greedy else
                       walk_sampled(tree, torch.softmax(out.logits[0].float() / temperature, -1).cpu(), generator))
    with stopwatch.part("cache crop"):
        rows = torch.tensor([0] + [1 + node for node in path], device=target.device)
        if not tree.is_chain():
            keep_positions(cache, torch.cat([torch.arange(prefix, device=target.device), prefix + rows]))
        elif len(path) < len(tree.tokens):  # a chain's accepted nodes are its first ones
            cache.crop(len(path) - len(tree.tokens))
    return [tree.tokens[node] for node in path] + [bonus], out.hidden_states, rows
