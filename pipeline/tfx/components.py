"""The pipeline's own TFX components, as Python-function components (TFX's documented way for
a step TFX does not ship): the BLEU evaluation and the infra check that gate the Pusher.

    BleuEvaluator(examples, model, bleu_floor, bleu_margin, eval_sentences, batch_size,
                  target_lang, bleu_tokenize, baseline_model=None) -> blessing: ModelBlessing
    InfraCheck(model) -> blessing: InfraBlessing

Each is a thin wrapper: it turns artifacts into paths, calls the body that imports no TFX
(:func:`aiayn.pipeline.tfx.evaluator.evaluate_and_bless`,
:func:`aiayn.pipeline.tfx.infra.infra_check`) and copies the result onto the output artifact's
custom properties, which TFX records in ML Metadata. ``blessed`` (1 or 0) is what the Pusher
reads; ``current_model_id`` is what ``LatestBlessedModelStrategy`` pairs a blessing with its
model by, as for TFX's own Evaluator and InfraValidator, so the next run's baseline resolves
from ML Metadata. Metrics (``bleu``, ``chrf``, their signatures, ``baseline_bleu``, ...) and the
``reason`` are custom properties too.

TFX stores the generated executors' dotted paths (``aiayn.pipeline.tfx.components.
BleuEvaluator_Executor``, ``...InfraCheck_Executor``) in compiled pipelines, so this module keeps
its address. It imports TFX when imported; without TFX it defines no components (the rest of
the project still imports it), and :data:`TFX_IMPORT_ERROR` says why.
"""

# No `from __future__ import annotations`: TFX reads the functions' annotations as objects.
from aiayn.pipeline.tfx import blessing as rules

try:
    from tfx import v1 as tfx
    from tfx.types import artifact_utils
    from tfx.utils import path_utils
except ImportError as _err:  # TFX is optional: pipeline/scripts/tfx_env.sh provides it
    tfx = None
    TFX_IMPORT_ERROR: str | None = str(_err)
else:
    TFX_IMPORT_ERROR = None


def _serving_dir(model) -> str:
    """The serving SavedModel inside a Trainer's Model artifact (what the Pusher copies)."""
    return path_utils.serving_model_path(model.uri, path_utils.is_old_model_artifact(model))


def _set_properties(artifact, values: dict) -> None:
    """Copies plain values onto an artifact's custom properties (recorded in ML Metadata)."""
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            artifact.set_int_custom_property(key, int(value))
        elif isinstance(value, int):
            artifact.set_int_custom_property(key, value)
        elif isinstance(value, float):
            artifact.set_float_custom_property(key, value)
        else:
            artifact.set_string_custom_property(key, str(value))


def _model_properties(model, prefix: str) -> dict:
    key, id_key = ((rules.CURRENT_MODEL_KEY, rules.CURRENT_MODEL_ID_KEY) if prefix == "current"
                   else (rules.BASELINE_MODEL_KEY, rules.BASELINE_MODEL_ID_KEY))
    return {key: model.uri, id_key: int(model.id)}


if tfx is not None:
    from aiayn.pipeline.errors import UserInputError

    InputArtifact = tfx.dsl.components.InputArtifact
    OutputArtifact = tfx.dsl.components.OutputArtifact
    Parameter = tfx.dsl.components.Parameter
    _standard = tfx.types.standard_artifacts

    @tfx.dsl.components.component
    def BleuEvaluator(  # noqa: N802  (a component class name, as TFX's own)
        examples: InputArtifact[_standard.Examples],
        model: InputArtifact[_standard.Model],
        blessing: OutputArtifact[_standard.ModelBlessing],
        bleu_floor: Parameter[float],
        bleu_margin: Parameter[float],
        eval_sentences: Parameter[int],
        batch_size: Parameter[int],
        target_lang: Parameter[str],
        bleu_tokenize: Parameter[str],
        baseline_model: InputArtifact[_standard.Model] = None,
    ) -> None:
        """sacreBLEU BLEU/chrF of ``model`` (and of the last blessed model) on the eval split;
        blesses ``model`` when it clears ``bleu_floor`` and is within ``bleu_margin`` of it.
        The parameters have no defaults here: the pipeline passes the config's (``tfx.*``,
        ``decode.batch_size``, ``data.target_lang``, ``train.bleu_tokenize``; definition.py)."""
        from aiayn.pipeline.tfx.evaluator import evaluate_and_bless

        if "eval" not in artifact_utils.decode_split_names(examples.split_names):
            raise UserInputError(f"ExampleGen's output {examples.uri} has no 'eval' split (it "
                                 f"has {examples.split_names}); the evaluation translates it.")
        eval_uri = artifact_utils.get_split_uri([examples], "eval")
        result = evaluate_and_bless(
            eval_patterns=[f"{eval_uri.rstrip('/')}/*"], model_dir=_serving_dir(model),
            baseline_dir=_serving_dir(baseline_model) if baseline_model else None,
            output_dir=blessing.uri, floor=bleu_floor, margin=bleu_margin,
            eval_sentences=eval_sentences, batch_size=batch_size, target_lang=target_lang,
            bleu_tokenize=bleu_tokenize)
        _set_properties(blessing, _model_properties(model, "current"))
        if baseline_model:
            _set_properties(blessing, _model_properties(baseline_model, "baseline"))
        _set_properties(blessing, {
            rules.BLESSED_KEY: bool(result["blessed"]), rules.REASON_KEY: result["reason"],
            **{k: result.get(k) for k in (
                "bleu", "chrf", "bleu_signature", "chrf_signature", "bleu_tokenize",
                "baseline_bleu",
                "baseline_chrf", "bleu_floor", "bleu_margin", "eval_sentences", "refused")}})

    @tfx.dsl.components.component
    def InfraCheck(  # noqa: N802
        model: InputArtifact[_standard.Model],
        blessing: OutputArtifact[_standard.InfraBlessing],
    ) -> None:
        """Loads ``model`` in a fresh TensorFlow + tensorflow-text process (the export
        verifier), replays its warmup requests and answers the sample sentences."""
        from aiayn.pipeline.tfx.infra import infra_check

        result = infra_check(_serving_dir(model), blessing.uri)
        _set_properties(blessing, _model_properties(model, "current"))
        _set_properties(blessing, {
            rules.BLESSED_KEY: bool(result["blessed"]), rules.REASON_KEY: result["reason"],
            "warmup_requests": int(result["warmup_requests"]),
            "samples": int(result["samples"])})
