"""One-step TTT warmup against the full unroll throughout, at about equal training time.

    python benchmarks/ttt_warmup.py --store STORE [--epochs 4] [--warmups 0.75:8 0.9:10]
                                    [--out benchmarks/out/ttt_warmup.json]

STORE is a training store of the EAGLE-3 default layers of the target's own replies (as for
benchmarks/recipe.py). Row 0 is the `quick` recipe before the warmup (TTT 4 at every step) for
`--epochs`; each later row (`SHARE:EPOCHS`) the same recipe whose first SHARE of steps unroll one
step only, for EPOCHS, chosen so that every row takes about the same time (a one-step unroll costs
about a third of a four-step one). Every row from seed 0, bfloat16 autocast, held-out split and
columns as recipe.py's, plus the training seconds. Each row is saved as it finishes and skipped on a re-run.
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
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--warmups", nargs="*", default=["0.75:8", "0.9:10"], help="SHARE:EPOCHS per row")
    parser.add_argument("--work", default=None, help="where the heads go (default: beside --out)")
    parser.add_argument("--out", default="benchmarks/out/ttt_warmup.json")
    args = parser.parse_args()
    key, layers, out, work, result = open_rows(args)
    quick = replace(preset("quick"), precision="bfloat16", eval_every=10**9, chain_depth=4, holdout=HOLDOUT,
                    ttt_warmup=0.0, attend_self=0.0)  # quick as it was before these rows
    rows = [(f"quick, TTT {quick.ttt_steps} throughout, {args.epochs} epochs", replace(quick, epochs=args.epochs))]
    for share, epochs in (row.split(":") for row in args.warmups):
        rows.append((f"quick, one-step TTT for the first {float(share):.0%} of steps, {epochs} epochs",
                     replace(quick, epochs=int(epochs), ttt_warmup=float(share))))
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
