"""Selection: candidate layer sets from the measures, the baselines, the HF layer-index
convention, and the selection stage's tasks.
"""
