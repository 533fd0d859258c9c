"""How much a head uses each layer it reads: held-out step-0 accuracy with that layer's states
replaced by states from random other positions of the same batch, one layer at a time.

A layer the head ignores costs nothing when shuffled; a layer it relies on costs accuracy. Under
Adam and little compute a head may read only its deepest layer (it carries most of the energy), in
which case every layer set scores alike; this shows whether that happened.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tasks.heads.draft_head import DraftHead
from tasks.heads.train_data import Batch
from tasks.heads.ttt import unroll


def shuffled_layer(batch: Batch, slot: int, hidden_size: int, generator: torch.Generator) -> Batch:
    """`batch` with layer `slot`'s states (its columns of aux) permuted over the valid positions."""
    aux = batch.aux.clone()
    columns = slice(slot * hidden_size, (slot + 1) * hidden_size)
    rows = batch.valid.nonzero(as_tuple=True)
    states = aux[rows][:, columns]
    aux[(*rows, columns)] = states[torch.randperm(len(states), generator=generator)]
    return replace(batch, aux=aux)


class LayerUse:
    """The shuffled-layer accuracies, gathered over the held-out batches the final evaluation
    already reads (`held_out_metrics`), which also gives the unshuffled step-0 accuracy."""

    def __init__(self, head: DraftHead, seed: int = 0):
        self.head, self.generator = head, torch.Generator().manual_seed(seed)
        self.correct = [0] * len(head.config.layers)

    def add(self, batch: Batch, index: torch.Tensor) -> None:
        size = self.head.config.hidden_size
        for slot in range(len(self.correct)):
            self.correct[slot] += unroll(self.head, shuffled_layer(batch, slot, size, self.generator), index, 1)[0].correct

    def summary(self, accuracy: float, positions: int) -> dict:
        """{"accuracy": step-0 accuracy unshuffled, "shuffled": {layer: with that layer shuffled},
        "drop": {layer: accuracy − shuffled}}."""
        shuffled = {layer: c / max(positions, 1) for layer, c in zip(self.head.config.layers, self.correct)}
        return {"accuracy": accuracy, "shuffled": shuffled,
                "drop": {layer: accuracy - value for layer, value in shuffled.items()}}
