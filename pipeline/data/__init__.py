"""Stage 1, data: a parallel corpus in, prepared splits, a vocabulary and tf.data batches out.

    corpus.py    prepare_data: read, normalise, check, split -> {train,dev,test}.tsv + report
    readers.py   the corpus formats (TSV, line-aligned text, TFRecord tf.Example, TFDS) and checks
    languages.py scripts and languages: the length unit across scripts, character coverage
    bible/       the default corpus from Debian's SWORD Bibles (extract -> align -> split)
    vocab.py     the joint SentencePiece model trained on the training split
    dataset.py   tf.data: tokenise, filter, 2-D length buckets, token-budget batches
    commands.py  `aiayn data`, `aiayn vocab`
"""
