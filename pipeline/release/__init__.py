"""Stage 4, release: the trained model as a verified, versioned TF Serving SavedModel, served.

    export_run.py  `aiayn export`: final weights -> <base>/<name>/<version>/, verified first
    model_card.py  the model card written into every export
    commands.py    `aiayn export`, `serve`, `translate`, `verify`, `model-card`
"""
