"""The default corpus: English (World English Bible) -> Spanish (Reina-Valera 1909) verse pairs.

Both Bibles are public-domain SWORD modules packaged by Debian (``sword-text-web`` ->
``engWEB2015eb``, ``sword-text-sparv`` -> ``spaRV1909eb``) and read with ``mod2imp``
(``libsword-utils``), which prints one ``$$$Book C:V`` entry of OSIS XML per verse.

Three steps, one module each, each testable without ``mod2imp``:

1. :mod:`~aiayn.pipeline.data.bible.extract`: entries -> plain verse text. :func:`parse_imp` and
   :func:`clean_osis`: notes (with their content), non-canonical titles/headings and speaker
   labels go; the words of ``<w>``, ``<transChange>``, ``<q>`` and other inline tags stay;
   canonical Psalm superscriptions stay (RV1909 prints them inside verse 1, WEB as
   ``<title canonical="true">`` in verse 1 or 0). :func:`book_verses` drops book introductions
   (chapter 0), verse 0 (except a canonical title, which is moved to verse 1), empty verses, and
   the RV1909 colophons after the last verse of the epistles ("... Amén. Fué escrita de
   Corinto ..."); :func:`load_books` pairs the books both modules have.
2. :mod:`~aiayn.pipeline.data.bible.align` (with the scorer in
   :mod:`~aiayn.pipeline.data.bible.lexicon`): RV1909 is keyed by KJV references, but its text
   follows the Hebrew/Spanish verse division in some chapters (Num 12:16 is RV's 13:1 and the
   whole of Num 13 runs one key late; Jonah 1:17/2:1; merges such as 2 Cor 13:12-13). Every pair
   is scored with a lexical translation table learned from the data (:class:`LexicalModel`: Dice
   association on the key-aligned majority, top translations per word, IDF-weighted coverage in
   both directions, times a length-ratio factor). The score threshold is calibrated on the data
   itself: deliberately shifted pairs are scored, and the threshold (the 95% quantile of their
   scores, clipped to [0.3, 0.5]) is reached by at most 5% of them. Chapters where every
   key-aligned pair clears the threshold and is not beaten by a neighbouring (shifted) reading
   are kept as they are; every run of other chapters is re-aligned as one block (so that verses
   moved across a chapter boundary are found) by a banded monotone dynamic program over 1-1,
   2-1, 1-2 and skip beads within +-4 positions of its key. A bead is kept only when its score
   clears the threshold (and a 1-1 bead only when no neighbouring reading beats it by more than
   a small margin), so no pair below the threshold reaches training; what cannot be aligned is
   dropped with a reason.
3. :mod:`~aiayn.pipeline.data.bible.split`: fixed whole-book dev/test sets (:data:`DEV_BOOKS`,
   :data:`TEST_BOOKS`).

:func:`~aiayn.pipeline.data.bible.build.build_bible_corpus` reads both modules, runs the three
steps and returns pairs per split, the alignment report, the clean-up counts and the package
versions. Example::

    from aiayn.pipeline.data.bible.build import build_bible_corpus

    corpus = build_bible_corpus()
    corpus.splits["train"][0]   # ('In the beginning, God created ...', 'EN el principio crió ...')
"""
