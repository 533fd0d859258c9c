"""Names the stages share, spelled once: the defaults a command falls back on and the method
names that mark the baselines among candidate layer sets."""

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_STORE = "layerwave.zarr"
EAGLE3_DEFAULT = "eagle3-default"  # the method name of every framework's [2, N//2, N-3]
RANDOM_PREFIX = "random-"  # random control sets are random-0, random-1, ...
FIXED_BASELINES = ("even", "last-k")  # the baselines that are neither the default nor random
DRAFTS = ("chain", "tree", "lookup", "hybrid", "auto")  # how `layerwave evaluate` drafts
