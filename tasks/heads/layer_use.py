"""How much a head uses each layer it reads: held-out step-0 accuracy with that layer's states
replaced by states from random other positions of the same batch, one layer at a time.

A layer the head ignores costs nothing when shuffled; a layer it relies on costs accuracy. Under
Adam and little compute a head may read only its deepest layer (it carries most of the energy), in
which case every layer set scores alike; this shows whether that happened.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tasks.heads.draft_head import DraftHead, target_to_draft
from tasks.heads.train_data import Batch, StoreBatches
from tasks.heads.ttt import unroll


def shuffled_layer(batch: Batch, slot: int, hidden_size: int, generator: torch.Generator) -> Batch:
    """`batch` with layer `slot`'s states (its columns of aux) permuted over the valid positions."""
    aux = batch.aux.clone()
    columns = slice(slot * hidden_size, (slot + 1) * hidden_size)
    rows = batch.valid.nonzero(as_tuple=True)
    states = aux[rows][:, columns]
    aux[(*rows, columns)] = states[torch.randperm(len(states), generator=generator)]
    return replace(batch, aux=aux)


@torch.no_grad()
def layer_use(head: DraftHead, data: StoreBatches, seed: int = 0) -> dict:
    """{"accuracy": held-out step-0 accuracy (all reply positions), "shuffled": {layer: the same with
    that layer shuffled}, "drop": {layer: accuracy − shuffled}}."""
    index = target_to_draft(head.t2d)
    size = head.config.hidden_size
    generator = torch.Generator().manual_seed(seed)
    layers = head.config.layers
    correct, positions = torch.zeros(len(layers) + 1), 0
    for batches, _ in data.heldout_shards():
        for batch in batches:
            batch = batch.to(index.device)
            plain = unroll(head, batch, index, 1)[0]
            correct[0] += plain.correct
            positions += plain.positions
            for slot in range(len(layers)):
                correct[1 + slot] += unroll(head, shuffled_layer(batch, slot, size, generator), index, 1)[0].correct
    accuracy = (correct / max(positions, 1)).tolist()
    shuffled = {layer: accuracy[1 + i] for i, layer in enumerate(layers)}
    return {"accuracy": accuracy[0], "shuffled": shuffled,
            "drop": {layer: accuracy[0] - value for layer, value in shuffled.items()}}
