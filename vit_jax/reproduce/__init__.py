"""Reproducing the paper's tables from the code: Table 6 compute, the Table 4 fine-tuning sweep,
VTAB-1k, and reports of measured accuracies beside the published ones.

Modules: `compute` (Table 6 exaFLOPs), `sweep` (learning rate chosen on a dev split), `vtab`
(the 19 VTAB-1k tasks), `report` (markdown, CSV and a bar chart), `paper` (the published
numbers). Command line: `python -m vit_jax.reproduce {compute,sweep,vtab,report}`.
"""
