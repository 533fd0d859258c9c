"""Attention that starts on the diagonal (`--attend-self`) against the default init, at equal
token-passes, on one training store.

    python benchmarks/attend_self.py --store STORE [--model smollm2-135m] [--std 0.05]
                                     [--out benchmarks/out/attend_self.json]

At init the head's attention averages its window almost evenly, so the token just fed (the
draft's own input) reaches the residual diluted by the window's length; with each query equal to
its key, a position attends mostly to itself from the first step. Pairs of rows, default init
and `--attend-self STD`: the first draft alone (TTT 1, 2 epochs) from seeds 0 and 1, then the
`quick` recipe (seed 0). Columns as in benchmarks/recipe.py; each row is saved as it finishes and
skipped on a re-run.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from recipe import HOLDOUT, open_rows, print_row, train_row
from tasks.heads.train_head import preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--std", type=float, default=0.05, help="std of the shared query/key init")
    parser.add_argument("--work", default=None, help="where the heads go (default: beside --out)")
    parser.add_argument("--out", default="benchmarks/out/attend_self.json")
    args = parser.parse_args()
    key, layers, out, work, result = open_rows(args)
    quick = replace(preset("quick"), precision="bfloat16", eval_every=10**9, chain_depth=4, holdout=HOLDOUT)
    first_draft = replace(quick, ttt_steps=1, ttt_warmup=0.0, epochs=2)
    rows = [(f"{recipe}, seed {seed}, {init}", replace(config, seed=seed, attend_self=std))
            for recipe, config, seeds in (("first draft only (TTT 1, 2 epochs)", first_draft, (0, 1)),
                                          (f"quick ({quick.epochs} epochs)", quick, (0,)))
            for seed in seeds
            for init, std in (("default init", 0.0), (f"attention on the diagonal (std {args.std})", args.std))]
    for index, (name, config) in enumerate(rows):
        if name not in result["rows"]:
            row = train_row(args.store, key, layers, work / f"row-{index}", config)
            result["rows"][name] = {**row, "seconds": row["token_passes"] / row["token_passes_per_s"]}
            print_row(name, result["rows"][name])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
