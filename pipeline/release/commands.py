"""`aiayn export`, `serve`, `translate`, `verify`, `model-card`: the release stage's commands.

    aiayn serve     --preset small                 # TF Serving if installed, else Docker, else dev
    aiayn translate --preset small "I love you."   # local export (latest version)
    echo "I love you." | aiayn translate --server http://127.0.0.1:8501
    aiayn verify    --preset small [--export exports/translate/3]
    aiayn translate --preset small --explain attention.png "I love you."   # attention maps
    aiayn model-card [--export DIR]

Handlers import the library lazily so that ``aiayn --help`` answers without loading TensorFlow.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiayn.pipeline.errors import UserInputError


def _export_dir(cfg, explicit: str | None) -> Path:
    from aiayn.export.saved_model import ExportError, latest_export

    if explicit:
        return Path(explicit)
    try:
        return latest_export(cfg.export.base_dir, cfg.export.model_name)
    except ExportError as err:
        raise UserInputError(str(err)) from None


def _docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def serve_command(base_dir: str | os.PathLike, rest_port: int = 8501, grpc_port: int = 8500,
                  host: str = "127.0.0.1", backend: str = "auto",
                  allow_all_interfaces: bool = False) -> tuple[str, list[str]]:
    """Which server ``serve`` starts and its command line (``backend``: auto|tfs|docker|dev).

    ``tensorflow_model_server`` has no option to choose the interface: it binds every one
    (0.0.0.0). It is refused when `host` names one interface, unless `allow_all_interfaces`.
    """
    from aiayn.export.saved_model import model_server_command

    base = Path(base_dir).resolve()
    command = model_server_command(base, grpc_port, rest_port)
    if backend in ("auto", "tfs") and shutil.which("tensorflow_model_server"):
        if host not in ("0.0.0.0", "::", "[::]", "") and not allow_all_interfaces:
            raise UserInputError(
                f"tensorflow_model_server binds all interfaces (0.0.0.0:{grpc_port} and "
                f"0.0.0.0:{rest_port}) and cannot bind only --host {host}. Pass "
                "--allow-all-interfaces to start it anyway (anyone who can reach this machine "
                "can then use it; put a firewall in front of it), or use --backend docker or "
                f"--backend dev, which bind {host} only.")
        return "tensorflow_model_server", command
    if backend == "tfs":
        raise UserInputError("tensorflow_model_server is not on PATH. Install it "
                             "(https://www.tensorflow.org/tfx/serving/setup) or use --backend dev.")
    if backend in ("auto", "docker") and _docker_answers():
        # Same absolute paths inside the container, so models.config works unchanged.
        return "docker", ["docker", "run", "--rm", "-p", f"{host}:{grpc_port}:{grpc_port}",
                          "-p", f"{host}:{rest_port}:{rest_port}", "-v", f"{base}:{base}:ro",
                          "--entrypoint", "tensorflow_model_server", "tensorflow/serving"
                          ] + command[1:]
    if backend == "docker":
        raise UserInputError("No Docker engine answers `docker info`; use --backend dev.")
    return "dev", []


def _cmd_serve(args: argparse.Namespace, cfg) -> None:
    from aiayn.export.saved_model import model_server_command

    base = Path(args.base_dir or cfg.export.base_dir)
    if not (base / cfg.export.model_name).is_dir():
        raise UserInputError(f"No export under {base / cfg.export.model_name}. Run "
                             "`aiayn export` first.")
    print("TF Serving command for this export:\n  "
          + " ".join(shlex.quote(a) for a in model_server_command(base, args.grpc_port,
                                                                 args.rest_port)),
          flush=True)
    kind, command = serve_command(base, args.rest_port, args.grpc_port, args.host, args.backend,
                                  allow_all_interfaces=args.allow_all_interfaces)
    if kind == "tensorflow_model_server":
        print(f"Note: tensorflow_model_server binds all interfaces (0.0.0.0:{args.grpc_port} "
              f"gRPC, 0.0.0.0:{args.rest_port} REST), whatever --host says.", flush=True)
    if kind != "dev":
        print(f"Starting {kind}:\n  {' '.join(shlex.quote(a) for a in command)}", flush=True)
        rc = subprocess.call(command)
        if rc:
            raise UserInputError(f"{kind} exited with status {rc}.")
        return None
    from aiayn.export.server import DevServer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # The development server's limits: (flag dest, DevServer keyword); unset: its default.
    names = (("workers", "threads"), ("max_connections", "max_connections"),
             ("max_request_bytes", "max_request_bytes"), ("header_timeout", "header_timeout"),
             ("read_timeout", "read_timeout"), ("drain_timeout", "drain_timeout"),
             ("model_config_file", "model_config_file"),
             ("batch_timeout_ms", "batch_timeout_ms"))
    options = {keyword: getattr(args, dest) for dest, keyword in names
               if getattr(args, dest, None) is not None}
    print("tensorflow_model_server and Docker not found: starting the development server "
          f"(REST http://{args.host}:{args.rest_port}, gRPC {args.host}:{args.grpc_port}). "
          "Ctrl-C or SIGTERM drains and stops it.", flush=True)
    try:
        server = DevServer(base, host=args.host, rest_port=args.rest_port,
                           grpc_port=args.grpc_port, poll_seconds=args.poll_seconds, **options)
    except ValueError as err:  # a limit out of range
        raise UserInputError(str(err)) from None
    server.serve_forever()
    return None


def _args_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-dir", default=None, help="Export base dir (default export.base_dir).")
    p.add_argument("--host", default="127.0.0.1",
                   help="Interface to bind (default 127.0.0.1; 0.0.0.0 exposes the server). "
                        "tensorflow_model_server always binds all interfaces: it is refused "
                        "for another --host unless --allow-all-interfaces.")
    p.add_argument("--allow-all-interfaces", action="store_true",
                   help="Start tensorflow_model_server although it binds all interfaces, not "
                        "just --host.")
    p.add_argument("--rest-port", type=int, default=8501)
    p.add_argument("--grpc-port", type=int, default=8500)
    p.add_argument("--backend", default="auto", choices=["auto", "tfs", "docker", "dev"],
                   help="auto: tensorflow_model_server if on PATH, else Docker, else the "
                        "development server.")
    p.add_argument("--poll-seconds", type=float, default=2.0,
                   help="Development server: how often to look for new versions and a "
                        "changed models.config.")
    dev = p.add_argument_group("development server limits")
    dev.add_argument("--workers", type=int, default=None,
                     help="Worker threads per API, REST and gRPC (default 32).")
    dev.add_argument("--max-connections", type=int, default=None,
                     help="Open REST connections and concurrent gRPC calls (default 512); more "
                          "are refused (503 / RESOURCE_EXHAUSTED).")
    dev.add_argument("--max-request-bytes", type=int, default=None,
                     help="Largest REST body / gRPC message (default 4194304, 4 MiB); larger "
                          "ones get 413 / RESOURCE_EXHAUSTED.")
    dev.add_argument("--header-timeout", type=float, default=None,
                     help="Seconds for a REST client to send its headers; also the idle "
                          "keep-alive timeout (default 10).")
    dev.add_argument("--read-timeout", type=float, default=None,
                     help="Seconds for a REST client to send its body after the headers "
                          "(default 30).")
    dev.add_argument("--drain-timeout", type=float, default=None,
                     help="On SIGTERM / Ctrl-C, seconds requests in flight may take to finish "
                          "(default 30).")
    dev.add_argument("--batch-timeout-ms", type=float, default=None,
                     help="How long a request waits for batch-mates (default 5; TF Serving's "
                          "batch_timeout_micros / 1000).")
    dev.add_argument("--model-config-file", default=None,
                     help="models.config with version policies and labels (default "
                          "<base-dir>/models.config).")


def _cmd_translate(args: argparse.Namespace, cfg) -> None:
    texts = list(args.text) or [line.rstrip("\n") for line in sys.stdin]
    if args.explain:
        return _explain(args, cfg, texts)
    refused: tuple[type[Exception], ...] = ()  # what a server answers with (no server: none)
    if args.engine == "ctranslate2":  # CTranslate2 only: TensorFlow is not loaded
        target = _ct2_export_dir(args, cfg)
    else:
        from aiayn.export.client import ServingClientError

        target, refused = args.server or str(_export_dir(cfg, args.export)), (ServingClientError,)
    try:
        client = _open_translator(args, cfg, target)
        results = []
        batch = cfg.export.max_batch_size
        for start in range(0, len(texts), batch):
            results += client.translate(texts[start:start + batch], n_best=args.n_best)
        unknown = [r.unknown_fraction for r in results]  # the n_best signature's output
        if not args.n_best and hasattr(client, "unknown_fractions"):  # a local export
            unknown = client.unknown_fractions(texts)
    except refused as err:
        raise UserInputError(f"the server refused the request: {err}") from None
    except FileNotFoundError as err:  # a directory without a SavedModel
        raise UserInputError(f"{err} Pass --export with a version directory such as "
                             f"{Path(cfg.export.base_dir) / cfg.export.model_name / '1'}, "
                             "or run `aiayn export` first.") from None
    except ValueError as err:
        raise UserInputError(str(err)) from None
    for i, result in enumerate(results):
        if result.truncated:
            print(f"warning: input {i + 1} was longer than the model's limit "
                  f"(export.max_input_tokens) and was truncated.", file=sys.stderr)
        if unknown[i] is not None and unknown[i] > UNKNOWN_WARNING_FRACTION:
            print(unknown_warning(i, unknown[i], _model_languages(client)), file=sys.stderr)
        if args.n_best:
            for text, score in result.n_best:
                print(f"{i}\t{score:.4f}\t{text}")
        elif args.scores:
            print(f"{result.score:.4f}\t{result.text}")
        else:
            print(result.text)
    return None


# `aiayn translate` warns when more than this share of an input's characters is unknown to the
# model's vocabulary (the n_best signature's `unknown_fraction`).
UNKNOWN_WARNING_FRACTION = 0.5


def unknown_warning(index: int, fraction: float, languages: str = "") -> str:
    """The warning for input ``index`` (0-based) whose characters are mostly unknown."""
    return (f"warning: input {index + 1}: {fraction:.0%} of its characters are unknown to the "
            f"model's vocabulary (a script or language it was not trained on"
            + (f"; it translates {languages}" if languages else "")
            + "): the output is a guess, not a translation.")


def _model_languages(client: Any) -> str:
    """``"en -> es"`` from a local export's ``assets.extra/config.yaml``; "" if unknown."""
    path = getattr(client, "path", None)
    if path is None:
        return ""
    import yaml

    try:
        data = yaml.safe_load((Path(path) / "assets.extra" / "config.yaml").read_text(
            encoding="utf-8"))["data"]
        return f"{data['source_lang']} -> {data['target_lang']}"
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return ""


def _args_translate(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="*", help="Sentences to translate (default: lines of stdin).")
    p.add_argument("--server", default=None,
                   help="http://host:8501 (REST) or grpc://host:8500 (gRPC); default: the local "
                        "export.")
    p.add_argument("--export", default=None,
                   help="An export directory (version or model dir); default: the latest "
                        "version under export.base_dir/export.model_name.")
    p.add_argument("--version", type=int, default=None, help="A specific model version.")
    p.add_argument("--engine", default="savedmodel", choices=["savedmodel", "ctranslate2"],
                   help="savedmodel (default): the SavedModel export or --server; ctranslate2: "
                        "the CTranslate2 export (`aiayn export --format ctranslate2`), latest "
                        "version under export.base_dir/ctranslate2/export.model_name[-QUANT], "
                        "or --export DIR.")
    p.add_argument("--quantization", default="none", metavar="QUANT",
                   help="--engine ctranslate2: which export, e.g. int8 for the one written with "
                        "--quantization int8 (default: none, the float32 one).")
    p.add_argument("--n-best", action="store_true",
                   help="Print every hypothesis with scores (the n_best signature; with "
                        "--server, also what warns about inputs the model's vocabulary does "
                        "not know).")
    p.add_argument("--scores", action="store_true", help="Print 'score<TAB>translation'.")
    p.add_argument("--explain", default=None, metavar="OUT.png",
                   help="Also plot the cross-attention of each translation (per head and the "
                        "mean) from the run's weights (train.run_dir/final.weights.h5, or "
                        "--weights); several sentences get OUT-2.png, OUT-3.png, ...")
    p.add_argument("--layer", type=int, default=-1,
                   help="--explain: which layer to show (0-based; default -1, the last).")
    p.add_argument("--self-attention", action="store_true",
                   help="--explain: also write OUT.encoder_self.png and OUT.decoder_self.png.")
    p.add_argument("--weights", default=None,
                   help="--explain: a .weights.h5 file (default: the run's final weights).")


def _explain(args: argparse.Namespace, cfg, texts: list[str]) -> None:
    """`translate --explain`: the run's Keras model (the weights the export was made from)."""
    if args.server:
        raise UserInputError("--explain needs the model's weights and runs locally; drop "
                             "--server (the serving signatures return no attention weights).")
    from aiayn.pipeline.config import source_limit
    from aiayn.pipeline.evaluation.explain import explain_translation
    from aiayn.pipeline.training.artifacts import load_trained_model

    model, tokenizer, _ = load_trained_model(cfg, args.weights)
    out = Path(args.explain)
    for i, text in enumerate(texts):
        path = out if i == 0 else out.with_name(f"{out.stem}-{i + 1}{out.suffix or '.png'}")
        data = explain_translation(
            model, tokenizer, text, path, layer=args.layer, beam_size=cfg.decode.beam_size,
            length_penalty=cfg.decode.length_penalty,
            max_extra_length=cfg.decode.max_extra_length, stop_rule=cfg.decode.stop_rule,
            max_length=source_limit(cfg), self_attention=args.self_attention)
        print(data["translation"])
        if data["unknown_fraction"] > UNKNOWN_WARNING_FRACTION:
            print(unknown_warning(i, data["unknown_fraction"],
                                  f"{cfg.data.source_lang} -> {cfg.data.target_lang}"),
                  file=sys.stderr)
        for kind, written in data["paths"].items():
            print(f"  {kind} attention (layer {data['layer']}): {written}", file=sys.stderr)
    return None


def _cmd_model_card(args: argparse.Namespace, cfg) -> None:
    from aiayn.pipeline.release import model_card

    if args.export:
        text = model_card.read_export_card(args.export)
    else:
        text = _latest_card(cfg)
        if text is None:  # no export with a card yet: describe the run as it stands
            text = model_card.write_model_card(cfg)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    print(text)


def _latest_card(cfg) -> str | None:
    from aiayn.export.saved_model import ExportError, latest_export
    from aiayn.pipeline.release.model_card import export_card_path

    try:
        path = export_card_path(latest_export(cfg.export.base_dir, cfg.export.model_name))
    except ExportError:
        return None
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _args_model_card(p: argparse.ArgumentParser) -> None:
    p.add_argument("--export", default=None,
                   help="An export (version or model dir); default: the latest export's card, "
                        "else a card built from the run directory.")
    p.add_argument("--output", default=None, help="Also write the card to this file.")


def _cmd_verify(args: argparse.Namespace, cfg) -> dict[str, Any]:
    from aiayn.export.verify import VerificationError, verify_export

    path = _export_dir(cfg, args.export)
    if not (path / "saved_model.pb").exists():
        from aiayn.export.saved_model import list_versions

        versions = list_versions(path)
        if not versions:
            raise UserInputError(f"{path} holds no SavedModel nor version directories.")
        path = path / str(versions[-1])
    try:
        report = verify_export(path)
    except FileNotFoundError as err:
        raise UserInputError(str(err)) from None
    except VerificationError as err:  # the child's stderr: the CLI keeps its last line
        raise UserInputError(f"{path} failed verification (re-export it with `aiayn export`, or "
                             f"pass --export with another version): {err}") from None
    print(report.signature_text)
    if not report.ok:
        raise UserInputError(f"{path} failed verification: {'; '.join(report.problems)}. The "
                             "stock model server would not serve it as-is; re-export it with "
                             "`aiayn export`.")
    return report.summary()


def _args_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("--export", default=None,
                   help="Version directory to check; default: the latest under "
                        "export.base_dir/export.model_name.")


def _cmd_export(args: argparse.Namespace, cfg) -> str:
    from aiayn.pipeline.release.export_run import export_run, export_run_ctranslate2

    if args.format == "ctranslate2":
        return str(export_run_ctranslate2(cfg, quantization=args.quantization))
    if args.quantization != "none":
        raise UserInputError("--quantization applies to --format ctranslate2 only (the "
                             "SavedModel is exported in float32).")
    return str(export_run(cfg))


def _args_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", default="savedmodel", choices=["savedmodel", "ctranslate2"],
                   help="savedmodel (default): the TF Serving SavedModel under "
                        "export.base_dir/export.model_name/<version>; ctranslate2: a "
                        "CTranslate2 model (needs `pip install '.[ct2]'`) under "
                        "export.base_dir/ctranslate2/export.model_name[-QUANT]/<version>.")
    p.add_argument("--quantization", default="none",
                   choices=["none", "int8", "int8_float32", "int8_float16", "int8_bfloat16",
                            "int16", "float16", "bfloat16", "float32"],
                   help="--format ctranslate2: weight quantization (default none: float32 as "
                        "trained; int8: 8-bit weights, the fastest on CPUs).")


def _ct2_export_dir(args: argparse.Namespace, cfg) -> Path:
    """The CTranslate2 version directory `translate --engine ctranslate2` uses."""
    from aiayn.export.ctranslate2 import CTranslate2Error, ct2_model_dir, resolve_ct2_export
    from aiayn.pipeline.release.command_lines import aiayn_command

    if args.server:
        raise UserInputError("--engine ctranslate2 translates in-process; drop --server.")
    path = (Path(args.export) if args.export else
            ct2_model_dir(cfg.export.base_dir, cfg.export.model_name, args.quantization))
    if args.version is not None and not args.export:
        path = path / str(args.version)
    try:
        return resolve_ct2_export(path, aiayn_command(cfg, "export", args.quantization,
                                                      ["--format", "ctranslate2"]))
    except CTranslate2Error as err:
        raise UserInputError(str(err)) from None


def _open_translator(args: argparse.Namespace, cfg, target: str | Path):
    """The CTranslate2 translator, or the client of a local export or a server."""
    if args.engine == "ctranslate2":
        from aiayn.export.ctranslate2 import CTranslate2Translator

        return CTranslate2Translator(target)
    from aiayn.export.client import connect

    return connect(target, cfg.export.model_name, args.version)


COMMANDS: dict[str, tuple[str, Callable, Callable | None]] = {
    "export": ("Write the serving SavedModel (versioned, atomic, verified) for TF Serving, or "
               "with --format ctranslate2 a CTranslate2 model.",
               _cmd_export, _args_export),
    "serve": ("Serve the export: tensorflow_model_server, Docker tensorflow/serving, or the "
              "development server (REST 8501, gRPC 8500).", _cmd_serve, _args_serve),
    "translate": ("Translate text from arguments or stdin with a local export or a server.",
                  _cmd_translate, _args_translate),
    "verify": ("Check an export in a fresh process: stock ops only, signatures, outputs.",
               _cmd_verify, _args_verify),
    "model-card": ("Print the model card (data, training, scores, limits) of an export.",
                   _cmd_model_card, _args_model_card),
}
