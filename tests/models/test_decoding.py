"""Greedy and beam search: scripted step functions, EOS and lengths, length penalty, graphs."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from models_helpers import BOS, EOS, PAD, make_batch, make_model

from aiayn.models import decoding

# Scripted vocabulary: 0 pad, 1 bos, 2 eos, 3 a, 4 b, 5 c.
S_PAD, S_BOS, S_EOS, A, B, C = range(6)


def bigram_step_fn(table):
    """A step function whose next-token distribution depends on the last token only."""
    log_table = ops.convert_to_tensor(np.log(table).astype("float32"))  # (V, V)

    def step_fn(ids, cache, index):
        last = ops.take(ids, index, axis=1)  # (N,)
        return ops.take(log_table, last, axis=0), cache  # (N, V)
    return step_fn


def bigram(rows, vocab=6):
    table = np.full((vocab, vocab), 1e-9)
    for prev, nxt in rows.items():
        for token, p in nxt.items():
            table[prev, token] = p
    for prev in range(vocab):
        if prev not in rows:
            table[prev, S_EOS] = 1.0
    return table / table.sum(1, keepdims=True)


# bos -> a .55 | b .45; a -> eos .5; b -> c .7; c -> eos .7.
TABLE = bigram({
    S_BOS: {A: 0.55, B: 0.45},
    A: {S_EOS: 0.5, A: 0.2, C: 0.2, B: 0.1},
    B: {C: 0.7, S_EOS: 0.1, A: 0.1, B: 0.1},
    C: {S_EOS: 0.7, A: 0.1, B: 0.1, C: 0.1},
})


def _np(out):
    return {k: ops.convert_to_numpy(v) for k, v in out.items()}


def _beam(table, batch=1, beam=4, max_length=6, alpha=0.0, n_best=1, eos=S_EOS):
    return _np(decoding.beam_search(bigram_step_fn(table), (), batch, S_BOS, eos, S_PAD, beam,
                                    max_length, alpha, n_best))


def _greedy(table, batch=1, max_length=6, alpha=0.0, eos=S_EOS):
    return _np(decoding.greedy_search(bigram_step_fn(table), (), batch, S_BOS, eos, S_PAD,
                                      max_length, alpha))


def test_beam_beats_greedy_on_scripted_logits():
    # Greedy: a (.55) then eos (.5) = .275. Beam: b c eos = .45 * .7 * .7 = .2205 < .275, so
    # make b -> eos likelier: a table where greedy's first choice is a trap.
    table = bigram({S_BOS: {A: 0.6, B: 0.4}, A: {S_EOS: 0.3, A: 0.35, B: 0.35},
                    B: {S_EOS: 0.9, A: 0.1}})
    greedy = _greedy(table)
    beam = _beam(table, beam=2)
    assert greedy["token_ids"][0, :3].tolist() == [A, A, A]  # a a ... (0.6 * 0.35 * ...)
    assert beam["token_ids"][0, 0, :2].tolist() == [B, S_PAD]  # b eos
    np.testing.assert_allclose(beam["scores"][0, 0], math.log(0.4 * 0.9), rtol=1e-5)
    assert beam["scores"][0, 0] > greedy["scores"][0]


def test_scripted_sequence_eos_and_lengths():
    # Row 0 spells "a b c eos"; row 1 never emits eos (runs to max_length).
    script = np.full((2, 8, 6), 1e-9)
    for i, token in enumerate([A, B, C, S_EOS]):
        script[0, i, token] = 1.0
    script[1, :, B] = 1.0
    log_script = ops.convert_to_tensor(np.log(script / script.sum(-1, keepdims=True)),
                                       dtype="float32")

    def step_fn(ids, cache, index):
        rows = ops.shape(ids)[0]
        beams = rows // 2
        logits = ops.take(log_script, index, axis=1)  # (2, V)
        return ops.repeat(logits, beams, axis=0), cache  # (2 * beams, V)

    greedy = _np(decoding.greedy_search(step_fn, (), 2, S_BOS, S_EOS, S_PAD, 6))
    assert greedy["token_ids"].tolist() == [[A, B, C, 0, 0, 0], [B] * 6]
    assert greedy["lengths"].tolist() == [3, 6]
    beam = _np(decoding.beam_search(step_fn, (), 2, S_BOS, S_EOS, S_PAD, 3, 6, 0.6, n_best=1))
    assert beam["token_ids"][:, 0].tolist() == [[A, B, C, 0, 0, 0], [B] * 6]
    assert beam["lengths"][:, 0].tolist() == [3, 6]
    assert beam["token_ids"].shape == (2, 1, 6)


def test_length_penalty_changes_ranking_as_the_formula_says():
    short = math.log(0.55 * 0.5)  # "a eos": 2 tokens with eos
    long = math.log(0.45 * 0.7 * 0.7)  # "b c eos": 3 tokens with eos

    def lp(length, alpha):
        return ((5 + length) / 6) ** alpha

    raw = _beam(TABLE, alpha=0.0, n_best=2)
    assert raw["token_ids"][0, 0, :2].tolist() == [A, 0]
    assert raw["token_ids"][0, 1, :3].tolist() == [B, C, 0]
    np.testing.assert_allclose(raw["scores"][0], [short, long], rtol=1e-5)
    assert raw["lengths"][0].tolist() == [1, 2]
    # alpha = 2: ((5+3)/6)^2 rewards the longer hypothesis enough to flip the order.
    assert long / lp(3, 2.0) > short / lp(2, 2.0)
    penalised = _beam(TABLE, alpha=2.0, n_best=2)
    assert penalised["token_ids"][0, 0, :3].tolist() == [B, C, 0]
    np.testing.assert_allclose(penalised["scores"][0],
                               [long / lp(3, 2.0), short / lp(2, 2.0)], rtol=1e-5)


def test_beam_one_equals_greedy_with_the_model_cache():
    # eos_id = -1 never matches: both run to max_length, so beam 1 must follow the argmax path
    # (this checks the beam bookkeeping and the cache reordering against greedy).
    model = make_model()
    features = make_batch()
    ids, mask = features["encoder_token_ids"], features["encoder_padding_mask"]
    memory = model.encoder_memory(model.encode(ids, mask), mask)

    def step_fn(seq, cache, index):
        return model.decode_step(ops.take(seq, index, axis=1), cache, index, memory)

    greedy = _np(decoding.greedy_search(step_fn, model.init_cache(3, 5), 3, BOS, -1, PAD, 5, 0.6))
    beam = _np(decoding.beam_search(step_fn, model.init_cache(3, 5), 3, BOS, -1, PAD, 1, 5, 0.6))
    np.testing.assert_array_equal(beam["token_ids"][:, 0], greedy["token_ids"])
    np.testing.assert_allclose(beam["scores"][:, 0], greedy["scores"], rtol=1e-5)


@pytest.mark.parametrize("beam_size", [2, 4])
def test_beam_ancestry_cache_equals_reordering_a_per_beam_cache(beam_size):
    # Reference: one cache row per beam, memory repeated per beam, every cache tensor gathered
    # on each re-ranking (the textbook method). The model's own path keeps one sentence-major
    # cache that is never copied and moves only the ancestry table. Same search, same model:
    # the hypotheses and scores must agree. eos_id = -1 never matches, so all K beams live to
    # max_length; at step 1 every beam descends from beam 0 (the only live one at step 0), so
    # rows are re-mapped from the first step on.
    model = make_model(dropout=0.0)
    features = make_batch(batch=3, src_len=7)
    ids, mask = features["encoder_token_ids"], features["encoder_padding_mask"]
    batch, max_length = 3, 9
    memory = model.encoder_memory(model.encode(ids, mask), mask)
    expanded = keras.tree.map_structure(
        lambda t: decoding.expand_to_beams(t, beam_size), memory)

    def reference_step(seq, cache, index):
        return model.decode_step(ops.take(seq, index, axis=1), cache, index, expanded)

    def ancestry_step(seq, cache, index):
        return model.decode_step(ops.take(seq, index, axis=1), cache, index, memory, beam_size)

    reference = _np(decoding.beam_search(
        reference_step, model.init_cache(batch * beam_size, max_length), batch, BOS, -1, PAD,
        beam_size, max_length, 0.6, n_best=beam_size))
    ours = _np(decoding.beam_search(
        ancestry_step, model.init_cache(batch, max_length, beam_size), batch, BOS, -1, PAD,
        beam_size, max_length, 0.6, n_best=beam_size, reorder_fn=model.reorder_cache))
    np.testing.assert_array_equal(ours["token_ids"], reference["token_ids"])
    np.testing.assert_allclose(ours["scores"], reference["scores"], rtol=1e-5, atol=1e-6)


def test_generate_contract_shapes_and_pad_after_eos():
    model = make_model()
    features = make_batch()
    out = _np(model.generate(features["encoder_token_ids"], features["encoder_padding_mask"],
                             BOS, EOS, beam_size=3, n_best=2, max_extra_length=4))
    assert out["token_ids"].shape == (3, 2, 7 + 4) and out["token_ids"].dtype == np.int32
    assert out["scores"].shape == (3, 2) and out["scores"].dtype == np.float32
    assert np.all(out["scores"][:, 0] >= out["scores"][:, 1])
    positions = np.arange(out["token_ids"].shape[-1])
    assert np.all(out["token_ids"][positions >= out["lengths"][..., None]] == PAD)
    assert not np.any(out["token_ids"] == EOS) and not np.any(out["token_ids"] == BOS)
    greedy = _np(model.generate(features["encoder_token_ids"], features["encoder_padding_mask"],
                                BOS, EOS, beam_size=1, max_extra_length=4))
    assert greedy["token_ids"].shape == (3, 1, 11)
    with pytest.raises(ValueError, match="n_best"):
        model.generate(features["encoder_token_ids"], features["encoder_padding_mask"], BOS,
                       EOS, beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="`stop_rule` must be one of current, bound.*'Bound'"):
        model.generate(features["encoder_token_ids"], features["encoder_padding_mask"], BOS,
                       EOS, beam_size=1, stop_rule="Bound")


@pytest.mark.parametrize("jit_compile", [False, True])
def test_generate_traces_with_dynamic_shapes(jit_compile):
    model = make_model()
    spec = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.bool)]

    @tf.function(input_signature=spec, jit_compile=jit_compile)
    def translate(ids, mask):
        return model.generate(ids, mask, BOS, EOS, beam_size=2, n_best=2, max_extra_length=3)

    graph_ops = {op.type for op in translate.get_concrete_function().graph.get_operations()}
    assert not graph_ops & {"PyFunc", "EagerPyFunc", "PyFuncStateless"}
    eager = model.generate(*[make_batch()[k] for k in ("encoder_token_ids",
                                                       "encoder_padding_mask")],
                           BOS, EOS, beam_size=2, n_best=2, max_extra_length=3)
    for batch, length in ((3, 7), (2, 4)):
        features = make_batch(batch=batch, src_len=length)
        out = translate(features["encoder_token_ids"], features["encoder_padding_mask"])
        assert tuple(out["token_ids"].shape) == (batch, 2, length + 3)
    features = make_batch()
    out = translate(features["encoder_token_ids"], features["encoder_padding_mask"])
    np.testing.assert_array_equal(ops.convert_to_numpy(out["token_ids"]),
                                  ops.convert_to_numpy(eager["token_ids"]))
    np.testing.assert_allclose(ops.convert_to_numpy(out["scores"]),
                               ops.convert_to_numpy(eager["scores"]), atol=1e-4)


def test_beam_helpers_shapes():
    x = ops.reshape(ops.arange(2 * 3 * 2), (2, 3, 2))  # (B=2, K=3, 2)
    flat = decoding.flatten_beam_dim(x)
    assert tuple(flat.shape) == (6, 2)
    assert tuple(decoding.unflatten_beam_dim(flat, 3).shape) == (2, 3, 2)
    picked = ops.convert_to_numpy(decoding.gather_beams(x, np.array([[2, 0], [1, 1]]), 3))
    np.testing.assert_array_equal(picked, ops.convert_to_numpy(x)[[[0], [1]], [[2, 0], [1, 1]]])
    np.testing.assert_allclose(float(decoding.length_penalty(4, 0.6)), (9 / 6) ** 0.6, rtol=1e-6)


# -- the shrinking search (finished sentences leave the batch; the cache grows) ---------------
def _shrinking(table, batch=1, beam=4, max_length=6, alpha=0.0, n_best=1):
    return _np(decoding.shrinking_beam_search(bigram_step_fn(table), (), batch, S_BOS, S_EOS,
                                              S_PAD, beam, max_length, alpha, n_best))


@pytest.mark.parametrize("alpha,n_best", [(0.0, 1), (0.6, 2), (1.0, 4)])
def test_shrinking_search_equals_the_static_search_on_scripted_logits(alpha, n_best):
    # Same search, same answers: on TABLE the sentences end after 1-3 tokens, so most leave the
    # batch early (the step function sees fewer rows; its ids are checked by the bigram lookup).
    for max_length in (2, 6):
        static = _beam(TABLE, batch=3, max_length=max_length, alpha=alpha, n_best=n_best)
        shrinking = _shrinking(TABLE, batch=3, max_length=max_length, alpha=alpha,
                               n_best=n_best)
        np.testing.assert_array_equal(shrinking["token_ids"], static["token_ids"])
        np.testing.assert_array_equal(shrinking["lengths"], static["lengths"])
        np.testing.assert_allclose(shrinking["scores"], static["scores"], rtol=1e-6)


def test_shrinking_search_runs_each_sentence_only_until_it_is_done():
    rows_seen = []

    def counting_step(ids, cache, index):
        rows_seen.append(int(ops.shape(ids)[0]))
        return bigram_step_fn(TABLE)(ids, cache, index)

    out = _np(decoding.shrinking_beam_search(counting_step, (), 2, S_BOS, S_EOS, S_PAD, 2, 6,
                                             0.0, 1))
    np.testing.assert_array_equal(out["token_ids"], _beam(TABLE, batch=2, beam=2)["token_ids"])
    # Eager: one call per step, 2 sentences x 2 beams while searching; fewer rows once the
    # n-best of both are settled, never a step with no sentence left.
    assert rows_seen[0] == 4 and rows_seen == sorted(rows_seen, reverse=True)
    assert len(rows_seen) < 6 and all(n > 0 and n % 2 == 0 for n in rows_seen)


@pytest.mark.parametrize("beam_size,n_best", [(2, 1), (4, 3)])
def test_generate_dynamic_shapes_equals_static_shapes(beam_size, n_best):
    # The model's growing cache + shrinking batch against its static ancestry cache, in
    # tf.function with unknown batch and length (as the export traces it) and eagerly. Sources
    # of different lengths, EOS reachable: some sentences finish long before others.
    model = make_model(dropout=0.0)
    features = make_batch(batch=5, src_len=7)
    ids, mask = features["encoder_token_ids"], features["encoder_padding_mask"]
    spec = [tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.bool)]

    def run(dynamic):
        return tf.function(lambda i, m: model.generate(
            i, m, BOS, EOS, beam_size=beam_size, n_best=n_best, max_extra_length=6,
            dynamic_shapes=dynamic), input_signature=spec)

    static, dynamic = _np(run(False)(ids, mask)), _np(run(True)(ids, mask))
    eager = _np(model.generate(ids, mask, BOS, EOS, beam_size=beam_size, n_best=n_best,
                               max_extra_length=6, dynamic_shapes=True))
    for out in (dynamic, eager):
        np.testing.assert_array_equal(out["token_ids"], static["token_ids"])
        np.testing.assert_array_equal(out["lengths"], static["lengths"])
        np.testing.assert_allclose(out["scores"], static["scores"], rtol=1e-4, atol=1e-5)


# -- the stop rule ------------------------------------------------------------------------------
# bos -> a .6 | b .4; a -> eos .8; b -> c .95; c -> eos .95. With alpha = 3, "b c eos" (3 tokens)
# outscores "a eos" (2 tokens), but only once it has ended: after 2 tokens, "a eos" beats every
# alive beam at its current length, so the "current" rule stops there; the "bound" rule sees that
# "b c" could still reach log(.38) / lp(max_length) and goes on.
LATE_TABLE = bigram({S_BOS: {A: 0.6, B: 0.4}, A: {S_EOS: 0.8, A: 0.1, B: 0.05, C: 0.05},
                     B: {C: 0.95, S_EOS: 0.05}, C: {S_EOS: 0.95, A: 0.05}})


@pytest.mark.parametrize("search", ["static", "shrinking"])
def test_stop_rules_current_stops_at_the_leader_and_bound_finds_the_late_winner(search):
    def lp(length):
        return ((5 + length) / 6) ** 3.0

    run = decoding.beam_search if search == "static" else decoding.shrinking_beam_search
    out = {rule: _np(run(bigram_step_fn(LATE_TABLE), (), 2, S_BOS, S_EOS, S_PAD, 2, 6, 3.0, 1,
                         stop_rule=rule)) for rule in decoding.STOP_RULES}
    assert out["current"]["token_ids"][:, 0, :2].tolist() == [[A, S_PAD]] * 2
    np.testing.assert_allclose(out["current"]["scores"][:, 0], math.log(0.6 * 0.8) / lp(2),
                               rtol=1e-5)
    assert out["bound"]["token_ids"][:, 0, :3].tolist() == [[B, C, S_PAD]] * 2
    np.testing.assert_allclose(out["bound"]["scores"][:, 0],
                               math.log(0.4 * 0.95 * 0.95) / lp(3), rtol=1e-5)
    assert out["bound"]["scores"][0, 0] > out["current"]["scores"][0, 0]


@pytest.mark.parametrize("n_best", [1, 2])
def test_stop_rule_current_takes_no_more_steps_and_static_equals_shrinking(n_best):
    steps = {}
    for rule in decoding.STOP_RULES:
        seen = []

        def counting_step(ids, cache, index, seen=seen):
            seen.append(int(ops.shape(ids)[0]))
            return bigram_step_fn(LATE_TABLE)(ids, cache, index)

        shrinking = _np(decoding.shrinking_beam_search(counting_step, (), 3, S_BOS, S_EOS,
                                                       S_PAD, 2, 6, 3.0, n_best, stop_rule=rule))
        static = _np(decoding.beam_search(bigram_step_fn(LATE_TABLE), (), 3, S_BOS, S_EOS, S_PAD,
                                          2, 6, 3.0, n_best, stop_rule=rule))
        np.testing.assert_array_equal(shrinking["token_ids"], static["token_ids"])
        np.testing.assert_allclose(shrinking["scores"], static["scores"], rtol=1e-6)
        steps[rule] = len(seen)
    # One best: "current" stops after 2 tokens, "bound" after 3. Two best: both need
    # "b c eos" finished, so both run 3 steps.
    assert (steps["current"], steps["bound"]) == ((2, 3) if n_best == 1 else (3, 3))


def test_unknown_stop_rule_is_refused():
    with pytest.raises(ValueError, match="`stop_rule` must be one of current, bound"):
        decoding.beam_search(bigram_step_fn(TABLE), (), 1, S_BOS, S_EOS, S_PAD, 2, 4,
                             stop_rule="never")
