"""Stage 2, training: the paper's recipe on ``model.fit``, resumable and distributable.

    train.py       train(cfg): strategy, model, data, callbacks, fit, the final weights
    recipe.py      Adam + the §5.3 schedule, label-smoothed loss, compile (Keras workarounds)
    fused_adam.py  Keras's Adam with each variable's update in TensorFlow's fused kernel
    callbacks.py   time/step budgets, the non-finite-loss guard, the SIGTERM stop, progress,
                   history, the target-token metric, late dropout
    deadline.py    the whole job's deadline: the time budget is what it leaves after a reserve
                   for the stages after training, timed by the dev evaluations
    dev_bleu.py    dev BLEU during training: the best weights, early stopping
    checkpoints.py step checkpoints and the resumable backup (crash-safe, repaired on start)
    averaging.py   checkpoint averaging and the choice of final.weights.h5 on dev
    validation.py  translate with the served graph, score with sacreBLEU (shared with evaluation)
    metrics.py     THE sacreBLEU settings by target language (BLEU tokenizer zh, ja-mecab, 13a...)
    artifacts.py   the run directory's files, the model factory, weights and split loading
    distribute.py  tf.distribute strategy, mixed precision, XLA resolved from the config
    commands.py    `aiayn train`, `aiayn average`
"""
