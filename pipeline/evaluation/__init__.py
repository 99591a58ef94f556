"""Stage 3, evaluation: how good the trained model is, and what it attends to.

    evaluate.py  `aiayn evaluate`: a split through the served graph, sacreBLEU BLEU and chrF
    explain.py   attention maps of a translation (translate --explain)
    plots.py     figures: attention heads, the positional encoding, the training curves
    commands.py  `aiayn evaluate`, `plot-positional-encoding`, `plot-curves`
"""
